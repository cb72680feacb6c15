// SPDX-License-Identifier: GPL-2.0
/*
 * tame: a Reno congestion control whose additive increase is scaled by 1/FM (Hacker et al. 2004's
 * fractional stream), FM read per destination address from a pinned BPF hash map.
 *
 * Key: the destination as 16 bytes, IPv4 as its IPv4-mapped IPv6 form (::ffff:a.b.c.d), so an IPv4
 * destination reached from a dual-stack socket finds the same entry. Value: FM x 1000 (u32). A
 * destination without an entry gets FM 1: plain Reno. The map is read on every call, so `tame cc apply`
 * acts on connections already open.
 *
 * Slow start, the multiplicative decrease and undo are Reno's, unscaled: whether they must scale too is
 * a calibration question (issue 32, deliverable 4), not settled here.
 *
 * The Reno logic is written out rather than calling the kernel's tcp_reno_* kfuncs so that the
 * increase can be scaled, and so the program does not depend on which kfuncs a kernel exposes.
 * Built by probes/cc/build.sh; registered and unregistered by probes/cc.py (`tame cc load|unload`).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char _license[] SEC("license") = "GPL";

#define AF_INET 2
#define AF_INET6 10
#define FM_UNIT 1000ULL /* the map holds FM x FM_UNIT */

struct tame_key {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tame_key);
	__type(value, __u32);
} tame_fm SEC(".maps");

/* Per socket: the additive-increase credit in thousandths of a segment. u64 because the threshold,
 * cwnd x FM x 1000, passes 2^32 at cwnd 43,000 x FM 100. */
struct tame_sk {
	__u64 credit;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tame_sk);
} tame_sk_stg SEC(".maps");

static __always_inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static __always_inline __u32 fm_milli(const struct sock *sk)
{
	struct tame_key key = {};
	__u32 *fm;

	if (sk->__sk_common.skc_family == AF_INET) {
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		*(__u32 *)&key.addr[12] = sk->__sk_common.skc_daddr;
	} else if (sk->__sk_common.skc_family == AF_INET6) {
		__builtin_memcpy(key.addr, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8, 16);
	} else {
		return FM_UNIT;
	}
	fm = bpf_map_lookup_elem(&tame_fm, &key);
	/* FM < 1 would grow faster than Reno; the CLI refuses it, and this refuses it again. */
	if (!fm || *fm < FM_UNIT)
		return FM_UNIT;
	return *fm;
}

static __always_inline bool tcp_in_slow_start(const struct tcp_sock *tp)
{
	return tp->snd_cwnd < tp->snd_ssthresh;
}

static __always_inline bool tcp_is_cwnd_limited(const struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	/* As the kernel's tcp_is_cwnd_limited: in slow start, let cwnd grow to twice what was in flight. */
	if (tcp_in_slow_start(tp))
		return tp->snd_cwnd < 2 * tp->max_packets_out;
	return !!BPF_CORE_READ_BITFIELD(tp, is_cwnd_limited);
}

SEC("struct_ops/tame_init")
void BPF_PROG(tame_init, struct sock *sk)
{
	struct tame_sk *st = bpf_sk_storage_get(&tame_sk_stg, sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);

	if (st)
		st->credit = 0;
}

SEC("struct_ops/tame_cong_avoid")
void BPF_PROG(tame_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct tame_sk *st;
	__u64 threshold, grow;
	__u32 cwnd;

	if (!tcp_is_cwnd_limited(sk))
		return;

	cwnd = tp->snd_cwnd;
	if (cwnd < tp->snd_ssthresh) {
		/* Reno's slow start (tcp_slow_start): grow by what was acked, up to ssthresh. */
		__u32 next = cwnd + acked;

		if (next > tp->snd_ssthresh)
			next = tp->snd_ssthresh;
		acked -= next - cwnd;
		cwnd = next;
		tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
		if (!acked)
			return;
		cwnd = tp->snd_cwnd;
	}

	st = bpf_sk_storage_get(&tame_sk_stg, sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return;
	/* Congestion avoidance (tcp_cong_avoid_ai with w = cwnd x FM): one segment per cwnd x FM
	 * segments acked, i.e. 1/FM segment a round trip. */
	threshold = (__u64)cwnd * fm_milli(sk);
	if (!threshold)
		return;
	st->credit += (__u64)acked * FM_UNIT;
	if (st->credit < threshold)
		return;
	grow = st->credit / threshold;
	st->credit -= grow * threshold;
	if (grow > 0xffff)
		grow = 0xffff;
	cwnd += (__u32)grow;
	tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
}

SEC("struct_ops/tame_ssthresh")
__u32 BPF_PROG(tame_ssthresh, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct tame_sk *st = bpf_sk_storage_get(&tame_sk_stg, sk, NULL, 0);
	__u32 half = tp->snd_cwnd >> 1;

	/* Credit earned at the old window is not spent at the halved one. */
	if (st)
		st->credit = 0;
	return half > 2 ? half : 2;
}

SEC("struct_ops/tame_undo_cwnd")
__u32 BPF_PROG(tame_undo_cwnd, struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	return tp->snd_cwnd > tp->prior_cwnd ? tp->snd_cwnd : tp->prior_cwnd;
}

SEC(".struct_ops")
struct tcp_congestion_ops tame = {
	.init = (void *)tame_init,
	.cong_avoid = (void *)tame_cong_avoid,
	.ssthresh = (void *)tame_ssthresh,
	.undo_cwnd = (void *)tame_undo_cwnd,
	.name = "tame",
};
