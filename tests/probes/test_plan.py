import threading
from dataclasses import replace

import pytest
from numpy.testing import assert_allclose

from probes.errors import NothingListening
from probes.fake import FakeDriver
from probes.plan import IDLE_STREAM_SHARE, ProbePlan, idle_streams, run_plan

DEST = "192.0.2.7:5201"


def rate(n):
    return 40e6 * n / (1 + 0.1 * n)


def test_default_plan_measures_idle_rtt_then_1_and_10_streams():
    driver = FakeDriver(rate, rtt_s=0.04)
    result = run_plan(driver, DEST)
    assert [c[0] for c in driver.calls] == ["idle_rtt", "run", "run"]
    assert [c[2] for c in driver.calls[1:]] == [1, 10]
    assert [(c[3], c[4]) for c in driver.calls[1:]] == [(30.0, 5.0), (30.0, 5.0)]
    assert result.dest == DEST and result.idle_rtt_s == 0.04
    # A flat fake series: the rate is the function's value, settled, with zero spread.
    assert_allclose([p.throughput_bps for p in result.probes], [rate(1), rate(10)])
    assert all(p.settled for p in result.probes)
    assert_allclose([p.throughput_stderr_bps for p in result.probes], [0.0, 0.0], atol=1e-6)


def test_repeats_interleave_levels_and_extra_levels_follow():
    driver = FakeDriver(rate)
    plan = ProbePlan(levels=(1, 10), extra_levels=(4,), repeats=2)
    result = run_plan(driver, DEST, plan)
    assert plan.schedule == (1, 10, 1, 10, 4, 4)
    assert [p.streams for p in result.probes] == [1, 10, 1, 10, 4, 4]


def test_unsettled_probe_is_rerun_twice_as_long_until_it_settles():
    # Rate ramps from half to full over the first 20 s. 10 s and 20 s probes end still rising;
    # a 40 s probe's middle third (t = 14.5..26.5 s) averages ~0.965 of its last (flat) third,
    # inside the 5 % tolerance.
    driver = FakeDriver(rate, ramp_s=20.0)
    plan = ProbePlan(levels=(1,), duration_s=10, omit_s=0, max_duration_s=60)
    result = run_plan(driver, DEST, plan)
    assert [c[3] for c in driver.calls if c[0] == "run"] == [10, 20, 40]
    assert result.probes[0].settled
    assert result.probes[0].duration_s == 40


def test_extension_stops_at_the_cap_and_reports_not_settled():
    driver = FakeDriver(rate, ramp_s=100.0, ramp_start_fraction=0.1)  # rises ~30 % per 10 s
    plan = ProbePlan(levels=(1,), duration_s=10, omit_s=0, max_duration_s=30)
    result = run_plan(driver, DEST, plan)
    assert [c[3] for c in driver.calls if c[0] == "run"] == [10, 20, 30]
    assert not result.probes[0].settled
    assert result.probes[0].throughput_stderr_bps > 0


def test_deadline_given_to_the_driver_covers_warm_up_duration_and_slack():
    seen = []

    class Recording(FakeDriver):
        def run(self, dest, streams, duration_s, omit_s, deadline_s, attempt=0):
            seen.append(deadline_s)
            return super().run(dest, streams, duration_s, omit_s, deadline_s, attempt)

    run_plan(Recording(rate), DEST, ProbePlan(levels=(1,), duration_s=10, omit_s=2, deadline_slack_s=5))
    assert seen == [17]


def test_progress_reports_every_step_in_order():
    events = []
    run_plan(FakeDriver(rate, ramp_s=15.0), DEST, ProbePlan(levels=(1, 10), duration_s=10, omit_s=0), progress=events.append)
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["idle_rtt", "idle_rtt_done"]
    assert kinds.count("probe") == 2 and kinds.count("probe_done") == 2 and "extend" in kinds
    done = [e for e in events if e.kind == "probe_done"]
    assert [(e.index, e.total, e.streams) for e in done] == [(1, 2, 1), (2, 2, 10)]
    assert all(e.result is not None for e in done)


def test_probe_error_propagates_and_nothing_is_returned():
    driver = FakeDriver(rate, fail_with=NothingListening("nothing listening at 192.0.2.7:5201"))
    with pytest.raises(NothingListening):
        run_plan(driver, DEST)
    assert [c[0] for c in driver.calls] == ["idle_rtt"]


def test_two_plans_to_one_destination_never_overlap():
    entered, release = threading.Event(), threading.Event()
    active, most = [0], [0]
    lock = threading.Lock()

    class Blocking(FakeDriver):
        def run(self, dest, streams, duration_s, omit_s, deadline_s, attempt=0):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            entered.set()
            release.wait(timeout=30)
            try:
                return super().run(dest, streams, duration_s, omit_s, deadline_s, attempt)
            finally:
                with lock:
                    active[0] -= 1

    first, second = Blocking(rate), Blocking(rate)
    plan = ProbePlan(levels=(1,))
    threads = [threading.Thread(target=run_plan, args=(d, DEST, plan)) for d in (first, second)]
    threads[0].start()
    assert entered.wait(timeout=30)
    threads[1].start()
    threads[1].join(timeout=0.2)  # the second plan is queued behind the first, not running
    assert second.calls == []
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert most[0] == 1
    assert [c[0] for c in second.calls] == ["idle_rtt", "run"]


@pytest.mark.parametrize(
    "kwargs, hint",
    [
        ({"levels": ()}, "at least one"),
        ({"levels": (1, 0)}, "positive integers"),
        ({"levels": (1, 2.5)}, "positive integers"),
        ({"levels": (1, 10), "extra_levels": (10,)}, "must not repeat"),
        ({"repeats": 0}, "repeats"),
        ({"duration_s": 0}, "duration_s"),
        ({"omit_s": -1}, "omit_s"),
        ({"duration_s": 30, "max_duration_s": 20}, "max_duration_s"),
        ({"settle_tolerance": -0.1}, "settle_tolerance"),
    ],
)
def test_bad_plan_raises_value_error_naming_the_field(kwargs, hint):
    with pytest.raises(ValueError, match=hint):
        ProbePlan(**kwargs)


def test_adaptive_probe_follows_at_the_level_the_chooser_picks():
    seen = []

    def choose(results):
        seen.append([r.streams for r in results])
        return 4

    driver = FakeDriver(rate)
    plan = ProbePlan(levels=(1, 10), duration_s=10, omit_s=2, adaptive_probes=1)
    result = run_plan(driver, DEST, plan, next_level=choose)
    # The chooser sees both fixed probes, in order, before the third is run at its level.
    assert seen == [[1, 10]]
    assert [p.streams for p in result.probes] == [1, 10, 4]
    assert_allclose(result.probes[2].throughput_bps, rate(4))
    # The worst case counts the adaptive probe like any other, each level tried twice (idle streams):
    # idle RTT + 3 x 2 x (2 + 10..60 s + 20 s slack).
    per_probe = sum(2 + d + 20 for d in (10, 20, 40, 60))
    assert plan.worst_case_s == pytest.approx(20 + 3 * 2 * per_probe)
    assert replace(plan, idle_retries=0).worst_case_s == pytest.approx(20 + 3 * per_probe)


@pytest.mark.parametrize("choice", [None, 10])
def test_adaptive_step_ends_when_the_chooser_has_nothing_new(choice):
    driver = FakeDriver(rate)
    result = run_plan(driver, DEST, ProbePlan(levels=(1, 10), adaptive_probes=2), next_level=lambda r: choice)
    assert [p.streams for p in result.probes] == [1, 10]


@pytest.mark.parametrize("cap, probed", [(None, [1, 10, 31]), (16, [1, 10, 16]), (10, [1, 10])])
def test_adaptive_probe_is_capped_at_the_plans_max_adaptive_streams(cap, probed):
    # A cap at a level already probed ends the plan, as the chooser naming that level would.
    plan = ProbePlan(levels=(1, 10), adaptive_probes=1, max_adaptive_streams=cap)
    result = run_plan(FakeDriver(rate), DEST, plan, next_level=lambda r: 31)
    assert [p.streams for p in result.probes] == probed


@pytest.mark.parametrize("cap", [0, -3, 2.5, True])
def test_max_adaptive_streams_must_be_a_positive_count(cap):
    with pytest.raises(ValueError, match="max_adaptive_streams"):
        ProbePlan(max_adaptive_streams=cap)


def test_adaptive_probes_need_a_chooser_and_a_bad_level_is_refused():
    assert [p.streams for p in run_plan(FakeDriver(rate), DEST, ProbePlan(adaptive_probes=1)).probes] == [1, 10]
    with pytest.raises(ValueError, match="stream count"):
        run_plan(FakeDriver(rate), DEST, ProbePlan(adaptive_probes=1), next_level=lambda r: 0)
    with pytest.raises(ValueError, match="adaptive_probes"):
        ProbePlan(adaptive_probes=-1)


def test_loss_limited_probe_runs_as_long_as_its_congestion_cycles_need():
    # 6 Mbit/s on one stream at 119 ms with 1000-byte segments: a Reno cycle is 89.25/2 round
    # trips = 5.31 s, so 8 cycles need 42.5 s. The flat 10 s probe would pass the trend test but
    # saw losses: it is re-run at once for ceil(42.5) = 43 s (not 20), which is enough.
    driver = FakeDriver(lambda n: 6e6, rtt_s=0.119, mss_bytes=1000, retransmits_per_stream=3)
    result = run_plan(driver, DEST, ProbePlan(levels=(1,), duration_s=10, omit_s=0))
    assert [c[3] for c in driver.calls if c[0] == "run"] == [10, 43]
    assert result.probes[0].settled


def test_probe_without_losses_needs_no_cycles():
    driver = FakeDriver(lambda n: 6e6, rtt_s=0.119, mss_bytes=1000, retransmits_per_stream=0)
    result = run_plan(driver, DEST, ProbePlan(levels=(1,), duration_s=10, omit_s=0))
    assert [c[3] for c in driver.calls if c[0] == "run"] == [10]
    assert result.probes[0].settled


def test_rate_is_taken_after_the_start_up_ramp():
    # 20 intervals rising from 50 % to 100 % of 40 Mbit/s over the first 8 s (midpoints 0.5..7.5 s),
    # then flat. The rate reported is the part after the ramp; the whole window's mean is kept.
    driver = FakeDriver(lambda n: 40e6, ramp_s=8.0)
    result = run_plan(driver, DEST, ProbePlan(levels=(1,), duration_s=20, omit_s=0)).probes[0]
    series = driver.run(DEST, 1, 20, 0, 30).interval_bps
    assert result.window_throughput_bps == pytest.approx(sum(series) / 20)
    assert result.throughput_bps > 0.98 * 40e6 > result.window_throughput_bps


def test_idle_streams_counts_streams_under_a_share_of_the_mean():
    base = FakeDriver(rate).run(DEST, 4, 10, 0, 30)
    assert idle_streams(base) == 0 and len(base.stream_bps) == 4
    assert idle_streams(replace(base, stream_bps=())) == 0  # no per-stream rates: nothing to judge
    mean = 1e6
    just_under, just_over = mean * IDLE_STREAM_SHARE * 0.99, mean * IDLE_STREAM_SHARE * 1.01
    # Rates chosen so the mean is 1 Mbit/s: the third stream is under 1 % of it, the fourth over.
    rest = 4 * mean - just_under - just_over
    assert idle_streams(replace(base, stream_bps=(rest / 2, rest / 2, just_under, just_over))) == 1
    assert idle_streams(replace(base, stream_bps=(mean,) * 4)) == 0


def test_a_probe_with_idle_streams_is_tried_again_and_the_fuller_attempt_kept():
    events = []
    driver = FakeDriver(rate, idle_streams_by_attempt={0: 7, 1: 0})
    result = run_plan(driver, DEST, ProbePlan(levels=(1, 10), duration_s=10, omit_s=0), progress=events.append)
    # One stream cannot sit idle beside itself, so level 1 is run once; level 10 twice, the second time
    # as attempt 1 (another time), whose ten running streams are kept.
    runs = [c for c in driver.calls if c[0] == "run"]
    assert [c[2] for c in runs] == [1, 10, 10]
    assert [idle_streams(p) for p in result.probes] == [0, 0]
    assert len(result.probes[1].stream_bps) == 10
    retries = [e for e in events if e.kind == "retry"]
    assert [(e.streams, idle_streams(e.result)) for e in retries] == [(10, 7)]
    done = [e for e in events if e.kind == "probe_done"]
    assert [(e.index, e.streams, idle_streams(e.result)) for e in done] == [(1, 1, 0), (2, 10, 0)]


@pytest.mark.parametrize("idle_by_attempt, kept_idle", [({0: 7, 1: 3}, 3), ({0: 3, 1: 7}, 3), ({0: 5, 1: 5}, 5)])
def test_when_every_attempt_has_idle_streams_the_one_with_fewest_is_kept(idle_by_attempt, kept_idle):
    driver = FakeDriver(rate, idle_streams_by_attempt=idle_by_attempt)
    result = run_plan(driver, DEST, ProbePlan(levels=(10,), duration_s=10, omit_s=0))
    assert idle_streams(result.probes[0]) == kept_idle


def test_no_retry_when_the_plan_allows_none():
    driver = FakeDriver(rate, idle_streams_by_attempt={0: 7})
    result = run_plan(driver, DEST, ProbePlan(levels=(10,), duration_s=10, omit_s=0, idle_retries=0))
    assert len([c for c in driver.calls if c[0] == "run"]) == 1
    assert idle_streams(result.probes[0]) == 7


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_idle_retries_must_be_a_count(value):
    with pytest.raises(ValueError, match="idle_retries"):
        ProbePlan(idle_retries=value)
