import pytest
from numpy.testing import assert_allclose

from models.evidence import loss_limited, loss_rate, reno_fraction
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
