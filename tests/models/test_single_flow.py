import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from models.fu_indulska import (
    fractional_multiplier,
    fractional_stream_share,
    fu_indulska_fast_recovery_throughput_bps,
    fu_indulska_peak_window_packets,
    fu_indulska_throughput_bps,
    multiplier_for_share,
)
from models.single_flow import (
    congestion_cycle_s, hacker_upper_bound_bps, mathis_throughput_bps, padhye_throughput_bps,
)


def test_mathis_at_known_point():
    # MSS 1460 B, RTT 0.1 s, p = 0.01, b = 1: 1460*8 / (0.1 * sqrt(0.02/3)) = 11680 / 0.0081650 = 1,430,500 bit/s
    assert_allclose(mathis_throughput_bps(1460, 0.1, 0.01), 11680 / (0.1 * math.sqrt(0.02 / 3)), rtol=1e-12)
    assert_allclose(mathis_throughput_bps(1460, 0.1, 0.01), 1.4305e6, rtol=1e-4)


def test_mathis_delayed_acks_divide_by_sqrt_b():
    assert_allclose(mathis_throughput_bps(1000, 0.05, 0.001, acked_per_ack=2),
                    mathis_throughput_bps(1000, 0.05, 0.001) / math.sqrt(2), rtol=1e-12)


def test_padhye_is_below_mathis_and_converges_at_low_loss():
    # The timeout term only adds to the denominator; at p = 1e-6 it is ~T0*3*sqrt(3p/8)*p, negligible.
    for p in (1e-2, 1e-3):
        assert padhye_throughput_bps(1460, 0.1, p, timeout_s=1.0) < mathis_throughput_bps(1460, 0.1, p)
    assert_allclose(padhye_throughput_bps(1460, 0.1, 1e-6, 1.0), mathis_throughput_bps(1460, 0.1, 1e-6), rtol=1e-3)


def test_padhye_at_known_point():
    # p = 0.01, b = 1, RTT 0.1, T0 1: RTT*sqrt(2p/3) = 0.0081650; min(1, 3 sqrt(0.03/8)) = 0.18371;
    # timeout term = 1 * 0.18371 * 0.01 * (1 + 32e-4) = 0.0018430; BW = 11680 / 0.0100080 = 1,167,066 bit/s
    assert_allclose(padhye_throughput_bps(1460, 0.1, 0.01, 1.0), 11680 / (0.1 * math.sqrt(0.02 / 3)
                    + 3 * math.sqrt(0.03 / 8) * 0.01 * 1.0032), rtol=1e-12)


def test_hacker_bound_is_sum_of_per_flow_mathis_without_constant():
    # MSS/RTT * sum 1/sqrt(p_i): two flows at p = 0.01 and 0.04 -> 11680/0.1 * (10 + 5) = 1,752,000
    assert_allclose(hacker_upper_bound_bps(1460, 0.1, [0.01, 0.04]), 1.752e6, rtol=1e-12)


def test_fu_indulska_single_standard_stream_equals_mathis():
    # n = 1, m = 1, c = 2: sqrt(1 * 3 / 2p) = 1/sqrt(2p/3), i.e. Mathis with b = 1.
    assert_allclose(fu_indulska_throughput_bps(1, 0.003, 1460, 0.08), mathis_throughput_bps(1460, 0.08, 0.003), rtol=1e-12)


def test_fu_indulska_parallel_grows_like_sqrt_2cn_minus_1():
    one = fu_indulska_throughput_bps(1, 0.001, 1000, 0.05)
    assert_allclose(fu_indulska_throughput_bps(10, 0.001, 1000, 0.05) / one, math.sqrt(39 / 3), rtol=1e-12)


def test_fu_indulska_peak_window_reproduces_eq1():
    # Eq. (1): BW = (1/p) MSS / ((W/(cmn)) RTT); with W from the helper it must equal the closed form.
    n, m, c, p = 4, 1.0, 2.0, 0.002
    w = fu_indulska_peak_window_packets(n, p, m, c)
    assert_allclose((1 / p) * 1000 * 8 / ((w / (c * m * n)) * 0.05), fu_indulska_throughput_bps(n, p, 1000, 0.05, m, c))


def test_fu_indulska_fast_recovery_eq2():
    # Eq. (2) replaces eq. (1)'s W/(cmn) rounds per loss by 1 + (W - n_e - 1)/(cmn).
    # n = n_e = 2, c = 2, m = 1, p = 1e-5: 2cn - 1 = 7, W = 4 sqrt(2/(7e-5)) = 676.12; eq.1 rounds = 169.03,
    # eq.2 rounds = 1 + 673.12/4 = 169.28, so eq.2 = eq.1 * 169.03/169.28 (0.15 % lower).
    eq1 = fu_indulska_throughput_bps(2, 1e-5, 1000, 0.05)
    eq2 = fu_indulska_fast_recovery_throughput_bps(2, 1e-5, 1000, 0.05)
    w = 4 * math.sqrt(2 / 7e-5)
    assert_allclose(eq2, eq1 * (w / 4) / (1 + (w - 3) / 4), rtol=1e-12)
    # One connection emulating two (MulTCP, n_e = 1) keeps one packet fewer in flight through fast
    # recovery, so it is slower than two real connections, as Fu & Indulska find in section 3.2.
    assert fu_indulska_fast_recovery_throughput_bps(2, 1e-5, 1000, 0.05, emulating_connections=1) < eq2


def test_fractional_multiplier_and_share():
    assert fractional_multiplier(4, 1) == 4.0
    # A stream with FM = 4 opens 1/4 packet per RTT: sqrt(1/4) = half a standard stream.
    assert_allclose(fractional_stream_share(4.0), 0.5)
    assert_allclose(multiplier_for_share(0.5), 4.0)
    assert_allclose(multiplier_for_share(fractional_stream_share(np.array([1.0, 9.0, 100.0]))), [1.0, 9.0, 100.0])


@pytest.mark.parametrize("bad", [dict(loss_rate=0), dict(loss_rate=1.5), dict(rtt_s=0), dict(mss_bytes=-1)])
def test_invalid_inputs_name_the_parameter(bad):
    args = dict(mss_bytes=1460, rtt_s=0.1, loss_rate=0.01) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        mathis_throughput_bps(**args)


def test_nan_is_rejected():
    with pytest.raises(ValueError):
        mathis_throughput_bps(1460, float("nan"), 0.01)


def test_congestion_cycle_is_half_a_window_of_round_trips():
    # 6 Mbit/s per stream at 119 ms with 1000-byte segments: W = 6e6 x 0.119 / 8000 = 89.25
    # segments; a cycle is W/2 = 44.6 round trips = 5.31 s.
    assert_allclose(congestion_cycle_s(6e6, 0.119, 1000), 89.25 / 2 * 0.119)
    with pytest.raises(ValueError, match="rtt_s"):
        congestion_cycle_s(6e6, 0.0, 1000)
