import numpy as np
import pytest
from numpy.testing import assert_allclose

from models.evidence import MIN_EXPECTED_LOSSES_PER_STREAM, loss_dispersion, loss_limited, loss_rate, reno_fraction
from models.parallel import ProbePoint


def test_loss_rate_is_retransmits_per_delivered_segment():
    # 8 Mbit/s for 10 s in 1000-byte segments: 10,000 segments; 25 retransmitted: 0.25 %.
    point = ProbePoint(1, 8e6, rtt_s=0.05, retransmits=25, duration_s=10, mss_bytes=1000)
    assert_allclose(loss_rate(point), 0.0025)


def test_stream_at_its_reno_rate_is_loss_limited():
    # Padhye (Lu eq. 2) at p = 0.0025, 50 ms, 1000 B, T0 = 1 s: the denominator is
    # 0.05 sqrt(2 x 0.0025 / 3) + 1 x 3 sqrt(3 x 0.0025 / 8) x 0.0025 x (1 + 32 x 0.0025^2)
    # = 0.0020412 + 0.0002297 = 0.0022710 s, so 8000 / 0.0022710 = 3.5227 Mbit/s per stream.
    # Two streams at 3.5227 Mbit/s each: fraction 1.
    segments = 2 * 3.5227e6 * 10 / 8000
    point = ProbePoint(2, 2 * 3.5227e6, rtt_s=0.05, retransmits=0.0025 * segments, duration_s=10, mss_bytes=1000)
    assert_allclose(reno_fraction(point), 1.0, rtol=1e-3)
    assert loss_limited(point) is True


def test_timeout_bound_stream_is_loss_limited_though_far_below_mathis():
    # p = 0.1 at 200 ms: Mathis allows 8000 / (0.2 x 0.2582) = 154.9 kbit/s, Padhye with timeouts
    # 8000 / (0.05164 + 1 x min(1, 3 sqrt(0.0375)) x 0.1 x 1.32) = 8000 / 0.12832 = 62.3 kbit/s.
    # A stream at 40 kbit/s is at 0.26 of Mathis but 0.64 of Padhye: loss-limited (starved by timeouts).
    point = ProbePoint(1, 40e3, rtt_s=0.2, retransmits=0.1 * 40e3 * 100 / 8000, duration_s=100, mss_bytes=1000)
    assert_allclose(reno_fraction(point), 40e3 / 62.34e3, rtol=2e-3)
    assert loss_limited(point) is True


def test_window_limited_stream_with_a_stray_loss_is_not_loss_limited():
    # 0.5 Mbit/s where its 0.25 % loss rate would allow 3.5227: fraction 0.142 < 0.5.
    point = ProbePoint(1, 0.5e6, rtt_s=0.05, retransmits=0.0025 * 0.5e6 * 10 / 8000, duration_s=10, mss_bytes=1000)
    assert_allclose(reno_fraction(point), 0.5 / 3.5227, rtol=1e-3)
    assert loss_limited(point) is False


def test_no_losses_count_only_over_enough_congestion_cycles():
    # 2 Mbit/s at 50 ms, 1000 B: W = 12.5 segments, a cycle is 6.25 RTTs = 0.3125 s; 3 cycles = 0.94 s.
    assert loss_limited(ProbePoint(1, 2e6, rtt_s=0.05, retransmits=0, duration_s=10, mss_bytes=1000)) is False
    # 80 Mbit/s at 100 ms: W = 1000 segments, a cycle is 50 s: 10 s without a loss says nothing.
    assert loss_limited(ProbePoint(1, 80e6, rtt_s=0.1, retransmits=0, duration_s=10, mss_bytes=1000)) is None


def test_no_losses_count_over_the_cycles_of_all_streams():
    # 80 Mbit/s per stream at 100 ms: a 50 s cycle, each ending in a loss for a loss-limited stream.
    # 10 streams for 10 s go through 10 x 10 / 50 = 2 cycles in all (under 3): cannot tell;
    # 20 streams through 4 cycles with no loss at all: not loss-limited.
    assert loss_limited(ProbePoint(10, 800e6, rtt_s=0.1, retransmits=0, duration_s=10, mss_bytes=1000)) is None
    assert loss_limited(ProbePoint(20, 1.6e9, rtt_s=0.1, retransmits=0, duration_s=10, mss_bytes=1000)) is False


@pytest.mark.parametrize("missing", ["retransmits", "rtt_s", "duration_s", "mss_bytes"])
def test_probe_without_the_evidence_cannot_tell(missing):
    fields = dict(streams=1, throughput_bps=2e6, rtt_s=0.05, retransmits=3, duration_s=10, mss_bytes=1000)
    fields[missing] = None
    assert loss_limited(ProbePoint(**fields)) is None


def ten_streams(rates_bps, counts):
    return ProbePoint(len(rates_bps), float(sum(rates_bps)), rtt_s=0.05, retransmits=int(sum(counts)), duration_s=30,
                      mss_bytes=1000, stream_bps=tuple(rates_bps), stream_retransmits=tuple(counts))


def test_losses_that_hit_every_stream_alike_disperse_less_than_random_drops():
    # Synchronised drop-tail losses: every stream loses once per congestion event, whatever its rate.
    assert loss_dispersion(ten_streams([2e6] * 10, [8] * 10)) == 0.0
    uneven = loss_dispersion(ten_streams([1e6, 3e6] * 5, [8] * 10))
    # Expected 4 and 12 for the slow and fast streams if drops were random: (4^2/4 + 4^2/12) x 5 / 9.
    assert_allclose(uneven, (16 / 4 + 16 / 12) * 5 / 9)
    # Losses in proportion to each stream's segments are what random drops expect: no dispersion either.
    assert loss_dispersion(ten_streams([1e6, 3e6] * 5, [4, 12] * 5)) == pytest.approx(0.0)


def test_random_drops_disperse_like_poisson_counts():
    # Each of 400 streams draws a Poisson count around a shared loss rate x its own segments: index about 1
    # (its standard deviation over 399 degrees of freedom is sqrt(2 / 399) = 0.07).
    rng = np.random.default_rng(7)
    rates = rng.uniform(1e6, 4e6, 400)
    index = loss_dispersion(ten_streams(rates, rng.poisson(20 * rates / rates.mean())))
    assert 0.8 < index < 1.2


def test_dispersion_needs_two_streams_that_moved_data_and_enough_losses():
    few = int(MIN_EXPECTED_LOSSES_PER_STREAM * 10) - 1
    assert loss_dispersion(ten_streams([2e6] * 10, [few // 10] * 9 + [few - 9 * (few // 10)])) is None
    assert loss_dispersion(ten_streams([2e6], [80])) is None
    assert loss_dispersion(ProbePoint(10, 2e7, retransmits=80)) is None  # no per-stream figures
    assert loss_dispersion(ten_streams([2e6] * 10, [8] * 9)) is None  # counts for 9 of 10 streams
    # A stream that carried nothing is left out, so it cannot inflate the index with its expected 0.
    assert loss_dispersion(ten_streams([2e6] * 10 + [0.0], [8] * 10 + [3])) == 0.0
