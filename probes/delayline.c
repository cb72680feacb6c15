/*
 * delayline: a constant propagation delay for one NFQUEUE queue (the kernel here has no netem).
 *
 * usage: delayline QUEUE_NUM DELAY_US [MAXLEN_PACKETS]
 *
 * Every packet the kernel queues to QUEUE_NUM is held for DELAY_US microseconds
 * (CLOCK_MONOTONIC, measured from when this process reads it) and then accepted.
 * Packets leave in arrival order, so one batch verdict releases every packet
 * that is due.  Only metadata is copied to user space (no payload), which keeps
 * the per-packet cost to one netlink message in and one amortised verdict out.
 *
 * SIGUSR1 prints how late releases were since the last report (stderr).
 * Exits 0 on SIGTERM/SIGINT; packets still held are dropped by the kernel when the
 * socket closes.  Exits 1 with a message on stderr on any set-up error.  Prints
 * "ready" on stdout once the queue is bound, so the caller knows rules may be added.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif
#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif

struct held {
    uint32_t id;
    int64_t due_ns;
};

static struct held *ring;
static size_t ring_cap, ring_head, ring_len;
static int64_t delay_ns;
static volatile sig_atomic_t stop;
static unsigned long long dropped_overflow;
/* Release lateness (time past due when a packet is accepted), reported on SIGUSR1 and then reset. */
static volatile sig_atomic_t report;
static int64_t late_max_ns, late_sum_ns;
static unsigned long long released;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        report = 1;
    else
        stop = 1;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data)
{
    (void)msg;
    (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (ring_len == ring_cap) {
        /* Full line: drop this packet rather than release it early (a late packet is a lie about the delay). */
        dropped_overflow++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    size_t tail = (ring_head + ring_len) % ring_cap;
    ring[tail].id = id;
    ring[tail].due_ns = now_ns() + delay_ns;
    ring_len++;
    return 0;
}

static void release_due(struct nfq_q_handle *qh)
{
    int64_t t = now_ns();
    uint32_t last = 0;
    int any = 0;
    while (ring_len > 0 && ring[ring_head].due_ns <= t) {
        int64_t late = t - ring[ring_head].due_ns;
        late_sum_ns += late;
        if (late > late_max_ns)
            late_max_ns = late;
        released++;
        last = ring[ring_head].id;
        any = 1;
        ring_head = (ring_head + 1) % ring_cap;
        ring_len--;
    }
    if (any)
        nfq_set_verdict_batch(qh, last, NF_ACCEPT);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s QUEUE_NUM DELAY_US [MAXLEN_PACKETS]\n", argv[0]);
        return 1;
    }
    int qnum = atoi(argv[1]);
    long long delay_us = atoll(argv[2]);
    long maxlen = argc == 4 ? atol(argv[3]) : 65536;
    if (qnum < 0 || qnum > 65535 || delay_us < 0 || maxlen < 1) {
        fprintf(stderr, "delayline: bad arguments\n");
        return 1;
    }
    delay_ns = delay_us * 1000LL;
    ring_cap = (size_t)maxlen;
    ring = calloc(ring_cap, sizeof *ring);
    if (ring == NULL) {
        fprintf(stderr, "delayline: out of memory\n");
        return 1;
    }

    /* Timer slack of 1 ns and a real-time priority keep the release times within tens of microseconds
     * even when other processes load both cores; both are best effort. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct sched_param sp = {.sched_priority = 50};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
        fprintf(stderr, "delayline: no real-time priority (%s); delay jitter may be higher\n", strerror(errno));
    mlockall(MCL_CURRENT | MCL_FUTURE);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        fprintf(stderr, "delayline: nfq_open failed: %s\n", strerror(errno));
        return 1;
    }
    struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)qnum, &on_packet, NULL);
    if (qh == NULL) {
        fprintf(stderr, "delayline: cannot bind queue %d: %s\n", qnum, strerror(errno));
        nfq_close(h);
        return 1;
    }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        fprintf(stderr, "delayline: cannot set copy mode: %s\n", strerror(errno));
        return 1;
    }
    /* The kernel queue must hold at least a delay's worth of packets at the highest rate we carry. */
    if (nfq_set_queue_maxlen(qh, (uint32_t)maxlen) < 0)
        fprintf(stderr, "delayline: cannot set queue length: %s\n", strerror(errno));
    int fd = nfq_fd(h);
    nfnl_rcvbufsiz(nfq_nfnlh(h), 64 * 1024 * 1024);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);

    printf("ready\n");
    fflush(stdout);

    static char buf[65536] __attribute__((aligned));
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (!stop) {
        struct timespec timeout, *tp = NULL;
        if (ring_len > 0) {
            int64_t wait = ring[ring_head].due_ns - now_ns();
            if (wait < 0)
                wait = 0;
            timeout.tv_sec = wait / 1000000000LL;
            timeout.tv_nsec = wait % 1000000000LL;
            tp = &timeout;
        }
        int r = ppoll(&pfd, 1, tp, NULL);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "delayline: poll failed: %s\n", strerror(errno));
            break;
        }
        if (r > 0) {
            for (;;) {
                ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (n < 0) {
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != EINTR)
                        fprintf(stderr, "delayline: recv failed: %s\n", strerror(errno));
                    break;
                }
                nfq_handle_packet(h, buf, (int)n);
            }
        }
        release_due(qh);
        if (report) {
            report = 0;
            fprintf(stderr, "delayline: released %llu, late mean %.1f us max %.1f us, held %zu, dropped %llu\n",
                    released, released ? late_sum_ns / 1e3 / released : 0.0, late_max_ns / 1e3, ring_len,
                    dropped_overflow);
            late_max_ns = late_sum_ns = 0;
            released = 0;
        }
    }
    if (dropped_overflow)
        fprintf(stderr, "delayline: dropped %llu packets because the line was full\n", dropped_overflow);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
