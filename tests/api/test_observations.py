"""POST /v1/observations with per-stream detail: stored as sent, tame transfers kept out of the refit, and
oversize or hostile bodies refused with the right status and nothing stored."""

import json

import pytest

from advisor.limits import MAX_STREAMS
from api.boundary import OBSERVATION_BODY_BYTES
from tests.api.conftest import probe_and_wait, rate

DEST = "127.0.0.1"


def _count(app) -> int:
    with app.state.service.store.db.transaction() as tx:
        return tx.execute("SELECT count(*) FROM observations").fetchone()[0]


def _advice(client) -> dict:
    return client.get("/v1/advice", params={"dest": DEST, "max_impact": 0.5}).json()


def test_a_tame_transfer_is_stored_with_its_detail_and_does_not_refit(service_factory):
    base, client, app = service_factory()
    probe_and_wait(client)
    before = _advice(client)
    body = {"dest": DEST, "streams": 3, "throughput_bps": 0.5 * rate(3), "stream_bps": [2e7, 2.5e7, 5e6],
            "stream_retransmits": [4, 7, 0], "stream_congestion_controls": ["cubic", "cubic", "tame"],
            "fractional_multiplier": 3.5, "tcp_equivalent_streams": 2.4, "duration_s": 10.0}
    response = client.post("/v1/observations", json=body)
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["refit"] is False and answer["feeds_fit"] is False and answer["accepted"] is True
    _, dest, _, stored = app.state.service.store.observation(answer["id"])
    assert dest == "127.0.0.1:5201"
    # stored under the service's default control, which the answer names, since the body named none
    assert stored.to_json() == {**{k: v for k, v in body.items() if k != "dest"},
                                "congestion_control": answer["congestion_control"]}
    assert stored.tame_streams == 1
    # Half the predicted rate would pull the fit down, had it been counted as three standard streams.
    after = _advice(client)
    assert after["observations_used"] == 0 and after["params"] == before["params"]


def test_a_standard_transfer_with_detail_refits_and_later_tame_ones_do_not_join_it(service_factory):
    # Probed under reno (the service's control here), so the reno transfers below belong to that curve.
    base, client, app = service_factory(congestion_control="reno")
    probe_and_wait(client)
    standard = {"dest": DEST, "streams": 2, "throughput_bps": 0.8 * rate(2), "stream_bps": [0.4 * rate(2)] * 2,
                "stream_congestion_controls": ["reno", "reno"]}
    answer = client.post("/v1/observations", json=standard).json()
    assert answer["refit"] is True and answer["feeds_fit"] is True
    tame = {"dest": DEST, "streams": 4, "throughput_bps": 1e6, "stream_congestion_controls": ["tame"] * 4,
            "fractional_multiplier": 16.0}
    assert client.post("/v1/observations", json=tame).json()["refit"] is False
    assert client.post("/v1/observations", json=standard).json()["refit"] is True
    assert _advice(client)["observations_used"] == 2  # the two standard ones, not the tame one
    # Its standard streams ran cubic: another control's curve, which has no probe run to refit on.
    cubic = {**standard, "stream_congestion_controls": ["cubic", "cubic"]}
    answer = client.post("/v1/observations", json=cubic).json()
    assert answer["congestion_control"] == "cubic" and answer["refit"] is False
    assert _advice(client)["observations_used"] == 2
    # A transfer whose standard streams ran two controls, or another than the one it names, is refused.
    for body in ({**standard, "stream_congestion_controls": ["cubic", "reno"]},
                 {**standard, "congestion_control": "cubic"},
                 {**standard, "congestion_control": "tame"}):
        response = client.post("/v1/observations", json=body)
        assert response.status_code == 422, (body, response.text)


def test_per_stream_lists_up_to_the_stream_limit_fit_under_the_body_cap(service_factory):
    base, client, app = service_factory()
    # The longest a legitimate body gets: MAX_STREAMS streams, 17 significant digits, 15-character names.
    body = {"dest": DEST, "streams": MAX_STREAMS, "throughput_bps": 1.2345678901234567e14,
            "stream_bps": [1.2345678901234567e-11] * MAX_STREAMS, "stream_retransmits": [2**53] * MAX_STREAMS,
            "stream_congestion_controls": ["abcdefghijklmn_"] * (MAX_STREAMS - 1) + ["tame"],
            "fractional_multiplier": 999999.999, "tcp_equivalent_streams": 1023.9999, "duration_s": 2591999.999}
    text = json.dumps(body, indent=1)
    assert len(text) < OBSERVATION_BODY_BYTES
    response = client.post("/v1/observations", content=text, headers={"Content-Type": "application/json"})
    assert response.status_code == 202, response.text
    assert _count(app) == 1


def _hostile():
    base = {"dest": DEST, "streams": 2, "throughput_bps": 1e6}
    return [
        pytest.param({**base, "stream_bps": [1e6] * 3}, 422, "stream_bps", id="more-rates-than-streams"),
        pytest.param({**base, "stream_bps": [1e6]}, 422, "stream_bps", id="fewer-rates-than-streams"),
        pytest.param({**base, "stream_bps": [1e6, -1]}, 422, "stream_bps", id="negative-rate"),
        pytest.param({**base, "stream_bps": [1e6, 1e16]}, 422, "stream_bps", id="rate-beyond-limit"),
        pytest.param({**base, "stream_retransmits": [1, 2]}, 422, "stream_retransmits needs stream_bps",
                     id="retransmits-without-rates"),
        pytest.param({**base, "stream_bps": [1, 2], "stream_retransmits": [1, -2]}, 422, "stream_retransmits",
                     id="negative-retransmits"),
        pytest.param({**base, "stream_congestion_controls": ["cubic", "tame\n"]}, 422, "stream_congestion_controls",
                     id="name-with-newline"),
        pytest.param({**base, "stream_congestion_controls": ["cubic", "../../etc/passwd"]}, 422,
                     "stream_congestion_controls", id="name-with-path"),
        pytest.param({**base, "stream_congestion_controls": ["cubic", "x" * 16]}, 422, "stream_congestion_controls",
                     id="name-too-long"),
        pytest.param({**base, "stream_congestion_controls": ["cubic", ""]}, 422, "stream_congestion_controls",
                     id="empty-name"),
        pytest.param({**base, "stream_congestion_controls": ["cubic", "tame"]}, 422, "fractional_multiplier",
                     id="tame-without-fm"),
        pytest.param({**base, "fractional_multiplier": 4.0}, 422, "stream_congestion_controls", id="fm-without-tame"),
        pytest.param({**base, "stream_congestion_controls": ["tame", "tame"], "fractional_multiplier": 0.5}, 422,
                     "fractional_multiplier", id="fm-below-one"),
        pytest.param({**base, "stream_congestion_controls": ["tame", "tame"], "fractional_multiplier": 1e7}, 422,
                     "fractional_multiplier", id="fm-beyond-map"),
        pytest.param({**base, "tcp_equivalent_streams": 0}, 422, "tcp_equivalent_streams", id="zero-n-star"),
        pytest.param({**base, "duration_s": -1}, 422, "duration_s", id="negative-duration"),
        pytest.param({**base, "stream_bps": [1.0] * (MAX_STREAMS + 1), "streams": MAX_STREAMS}, 422, "stream_bps",
                     id="list-beyond-stream-limit"),
        pytest.param({**base, "tame_streams": 0}, 422, "tame_streams", id="extra-field"),
        pytest.param({**base, "stream_bps": [0.5] * 40_000}, 413, "larger than", id="over-the-cap"),
    ]


@pytest.mark.parametrize("body, status, says", _hostile())
def test_bad_and_hostile_bodies_are_refused_and_nothing_is_stored(service_factory, body, status, says):
    base, client, app = service_factory(start_worker=False)
    response = client.post("/v1/observations", json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["detail"]
    assert _count(app) == 0


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_per_stream_numbers_are_refused(service_factory, token):
    base, client, app = service_factory(start_worker=False)
    text = f'{{"dest": "{DEST}", "streams": 2, "throughput_bps": 1e6, "stream_bps": [1e6, {token}]}}'
    response = client.post("/v1/observations", content=text, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert _count(app) == 0


def test_a_chunked_body_past_the_cap_is_refused_while_it_streams_in(service_factory):
    base, client, app = service_factory(start_worker=False)
    piece = b'{"dest": "127.0.0.1", "streams": 1, "throughput_bps": 1e6, "stream_bps": [' + b"0.5, " * 1000

    def chunks():
        for _ in range(OBSERVATION_BODY_BYTES // len(piece) + 2):
            yield piece

    response = client.post("/v1/observations", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert _count(app) == 0


def test_the_advice_says_how_to_open_it_and_its_fm_is_the_advice_s(service_factory):
    base, client, app = service_factory()
    probe_and_wait(client)
    for budget in (0.05, 0.2, 0.5, 0.9):
        advice = client.get("/v1/advice", params={"dest": DEST, "max_impact": budget}).json()
        opening = advice["open"]
        assert opening["fractional_multiplier"] == advice["fractional_multiplier"]
        assert opening["tcp_equivalent_streams"] == advice["tcp_equivalent_streams"]
        if advice["fractional_multiplier"] is None:
            assert opening["form"] == "standard" and opening["command"] is None
            assert opening["standard_streams"] == advice["num_flows"]
        else:
            assert opening["form"] == "fractional" and opening["congestion_control"] == "tame"
            assert opening["command"].startswith("tame cc apply 127.0.0.1 --tcp-equivalent ")
        batch = client.post("/v1/advice:batch", json=[{"dest": DEST, "max_impact": budget}]).json()
        assert batch["results"][0]["advice"]["open"] == opening


def test_transfers_to_a_link_with_no_probe_run_are_stored_without_reading_the_refit_window(service_factory,
                                                                                            monkeypatch):
    # Without a probe run there is nothing to refit on; main's code still read and parsed the link's newest 200
    # standard observations inside the write lock (the whole store's on SQLite) for each one sent: with 1024-stream
    # lists that grew to ~190 ms a request, every other write waiting behind it.
    from advisor.store import _RefitWindow

    reads = []
    real_read = _RefitWindow.read
    monkeypatch.setattr(_RefitWindow, "read",
                        lambda self, tx, destination_id, limit: reads.append(limit) or real_read(
                            self, tx, destination_id, limit))
    base, client, app = service_factory(start_worker=False)
    body = {"dest": DEST, "streams": MAX_STREAMS, "throughput_bps": 1e9,
            "stream_bps": [1e9 / MAX_STREAMS] * MAX_STREAMS, "stream_retransmits": [7] * MAX_STREAMS}
    for _ in range(3):
        response = client.post("/v1/observations", json=body)
        assert response.status_code == 202 and response.json()["refit"] is False, response.text
    assert _count(app) == 3 and reads == []
    # Once the link has a probe run, a transfer refits on it and the observations since.
    pushed = client.post("/v1/probe-runs", json={"dest": DEST, "probes": [
        {"streams": n, "throughput_bps": rate(n)} for n in (1, 10)]})
    assert pushed.status_code == 201 and pushed.json()["fitted"], pushed.text
    response = client.post("/v1/observations", json={"dest": DEST, "streams": 4, "throughput_bps": rate(4)})
    assert response.status_code == 202 and response.json()["refit"] is True, response.text
    assert reads
