"""How the routes read a JSON body: as FastAPI does, except that an object giving one key twice is malformed.

JSON parsers keep one of the two values, silently, and the sender may have meant the other. api/app.py makes every
route a UniqueKeysRoute, so FastAPI reads each body through UniqueKeysRequest.json, which raises the error FastAPI
answers a body that is not JSON with (RequestValidationError "json_invalid"; 422 in api/app.py). The rule is
advisor.limits.unique_keys, the one the queue files of `tame schedule` are read with. A body the parser cannot read
for another reason (not UTF-8, nested past Python's recursion limit, a whole number too long for int()), or that
holds a NUL character in a string (no field takes one; PostgreSQL cannot store one), is answered the same way:
FastAPI would answer those 400, a status no route documents, saying only that parsing failed.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Coroutine

from fastapi import Request, Response
from fastapi.routing import APIRoute

from advisor.errors import DuplicateKey
from advisor.limits import unique_keys

_UNIQUE_KEYS = unique_keys("the body")


class UniqueKeysRequest(Request):
    """A request whose JSON body is refused (json.JSONDecodeError, its message the answer's) when it is not JSON
    or an object in it gives a key twice."""

    async def json(self) -> Any:
        body = await self.body()
        try:
            doc = json.loads(body, object_pairs_hook=_UNIQUE_KEYS)
        except DuplicateKey as exc:
            # The hook is not told where the object is: the message names the key instead of a position.
            raise json.JSONDecodeError(str(exc), "", 0) from exc
        except json.JSONDecodeError as exc:
            raise json.JSONDecodeError(f"the body is not valid JSON: {exc}", exc.doc, exc.pos) from exc
        except UnicodeDecodeError as exc:
            raise json.JSONDecodeError(f"the body is not valid JSON: it is not UTF-8 text ({exc.reason} at byte "
                                       f"{exc.start}); send it encoded as UTF-8", "", 0) from exc
        except ValueError as exc:  # int() refuses a whole number this long; the parser raises no other ValueError
            raise json.JSONDecodeError(f"the body holds a whole number of more than {sys.get_int_max_str_digits()} "
                                       "digits; no field takes one", "", 0) from exc
        except RecursionError as exc:  # the parser recurses per level; a request nests at most four deep
            raise json.JSONDecodeError("the body nests arrays or objects too deeply to be a request; a probe run, "
                                       "the deepest, nests four levels", "", 0) from exc
        # No field takes a NUL, and PostgreSQL cannot store one in text (a 503 else). Walked whatever the bytes: the
        # parser also reads UTF-16 and UTF-32, where the escape \\u0000 is not those six bytes.
        where = _nul_at(doc)
        if where is not None:
            raise json.JSONDecodeError(f"{where[:100]}: the body holds a NUL character (\\u0000) in a string; no field "
                                       "takes one", "", 0)
        return doc


def _nul_at(doc: Any) -> str | None:
    """Where a string in ``doc`` (parsed JSON), a key or a value, holds NUL (``probes[0].raw``; ``the body`` for
    the top level); None when none does."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where.lstrip(".") or "the body"
        elif isinstance(item, dict):
            stack.extend((f"{where}.{key!r}", key) for key in item)
            stack.extend((f"{where}.{key}", value) for key, value in item.items())
        elif isinstance(item, list):
            stack.extend((f"{where}[{index}]", value) for index, value in enumerate(item))
    return None


class UniqueKeysRoute(APIRoute):
    """A route that reads its body with UniqueKeysRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_unique_keys(request: Request) -> Response:
            return await handler(UniqueKeysRequest(request.scope, request.receive))

        return read_unique_keys
