// SPDX-License-Identifier: GPL-2.0
/*
 * tame: a Reno congestion control whose additive increase is scaled by 1/FM (Hacker et al. 2004's
 * fractional stream), FM read per (network namespace, destination address) from a BPF hash map.
 *
 * Key: the socket's network namespace cookie (SO_NETNS_COOKIE; the map is kernel-wide, routes and the
 * processes that set entries are per namespace, so one namespace's entry never reaches another's sockets)
 * and the destination as 16 bytes, IPv4 as its IPv4-mapped IPv6 form (::ffff:a.b.c.d), so an IPv4
 * destination reached from a dual-stack socket finds the same entry. Value: struct tame_setting, FM x 1000
 * and flags. A destination without an entry gets FM 1: plain Reno. The map is read on every call, so
 * `tame cc apply` acts on connections already open.
 *
 * The multiplicative decrease and undo are Reno's, unscaled. Slow start is Reno's unless the setting
 * carries TAME_SCALE_SLOW_START, which grows it by acked/FM instead of acked (docs/tame-cc.md says
 * which the calibration keeps, and why).
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
	__u64 netns; /* net->net_cookie of the socket's namespace */
	__u8 addr[16];
};

#define TAME_SCALE_SLOW_START 1U /* flags: slow start grows acked/FM segments per ack, not acked */

struct tame_setting {
	__u32 fm_milli; /* FM x FM_UNIT */
	__u32 flags;    /* TAME_* bits */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tame_key);
	__type(value, struct tame_setting);
} tame_fm SEC(".maps");

/* Per socket: the additive-increase credit in thousandths of a segment (u64 because the threshold,
 * cwnd x FM x 1000, passes 2^32 at cwnd 43,000 x FM 100), and the scaled slow start's. */
struct tame_sk {
	__u64 credit;
	__u64 ss_credit;
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

static const struct tame_setting reno = { .fm_milli = FM_UNIT, .flags = 0 };

static __always_inline struct tame_setting setting_of(const struct sock *sk)
{
	struct tame_key key = {};
	struct tame_setting *found;

	key.netns = sk->__sk_common.skc_net.net->net_cookie;
	if (sk->__sk_common.skc_family == AF_INET) {
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		*(__u32 *)&key.addr[12] = sk->__sk_common.skc_daddr;
	} else if (sk->__sk_common.skc_family == AF_INET6) {
		__builtin_memcpy(key.addr, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8, 16);
	} else {
		return reno;
	}
	found = bpf_map_lookup_elem(&tame_fm, &key);
	/* FM < 1 would grow faster than Reno; the CLI refuses it, and this refuses it again. */
	if (!found || found->fm_milli < FM_UNIT)
		return reno;
	return *found;
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

	if (st) {
		st->credit = 0;
		st->ss_credit = 0;
	}
}

SEC("struct_ops/tame_cong_avoid")
void BPF_PROG(tame_cong_avoid, struct sock *sk, __u32 ack, __u32 acked)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct tame_setting setting;
	struct tame_sk *st;
	__u64 threshold, grow;
	__u32 cwnd;

	if (!tcp_is_cwnd_limited(sk))
		return;

	setting = setting_of(sk);
	st = bpf_sk_storage_get(&tame_sk_stg, sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return;
	cwnd = tp->snd_cwnd;
	if (cwnd < tp->snd_ssthresh && (setting.flags & TAME_SCALE_SLOW_START)) {
		/* Scaled slow start: one segment per FM segments acked, up to ssthresh; what is left of
		 * `acked` at ssthresh goes on to congestion avoidance as in Reno. */
		__u32 room = tp->snd_ssthresh - cwnd;

		st->ss_credit += (__u64)acked * FM_UNIT;
		grow = st->ss_credit / setting.fm_milli;
		if (grow < room) {
			st->ss_credit -= grow * setting.fm_milli;
			tp->snd_cwnd = cwnd + (__u32)grow < tp->snd_cwnd_clamp ? cwnd + (__u32)grow : tp->snd_cwnd_clamp;
			return;
		}
		st->ss_credit = 0;
		acked = 0;
		cwnd = tp->snd_ssthresh;
		tp->snd_cwnd = cwnd < tp->snd_cwnd_clamp ? cwnd : tp->snd_cwnd_clamp;
		return;
	}
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

	/* Congestion avoidance (tcp_cong_avoid_ai with w = cwnd x FM): one segment per cwnd x FM
	 * segments acked, i.e. 1/FM segment a round trip. */
	threshold = (__u64)cwnd * setting.fm_milli;
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
	if (st) {
		st->credit = 0;
		st->ss_credit = 0;
	}
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
