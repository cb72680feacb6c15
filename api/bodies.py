"""How the routes read a JSON body: as FastAPI does, except that an object giving one key twice is malformed.

JSON parsers keep one of the two values, silently, and the sender may have meant the other. api/app.py makes every
route a UniqueKeysRoute, so FastAPI reads each body through UniqueKeysRequest.json, which raises the error FastAPI
answers a body that is not JSON with (RequestValidationError "json_invalid"; 422 in api/app.py). The rule is
advisor.limits.unique_keys, the one the queue files of `tame schedule` are read with.
"""

from __future__ import annotations

import json
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
            return json.loads(body, object_pairs_hook=_UNIQUE_KEYS)
        except DuplicateKey as exc:
            # The hook is not told where the object is: the message names the key instead of a position.
            raise json.JSONDecodeError(str(exc), "", 0) from exc
        except json.JSONDecodeError as exc:
            raise json.JSONDecodeError(f"the body is not valid JSON: {exc}", exc.doc, exc.pos) from exc


class UniqueKeysRoute(APIRoute):
    """A route that reads its body with UniqueKeysRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_unique_keys(request: Request) -> Response:
            return await handler(UniqueKeysRequest(request.scope, request.receive))

        return read_unique_keys
