# Qiu/Lu dumbbell (Lu et al. 2004, Fig. 1): N1,N2 -> N3 --L3-- N4 -> N5,N6.
# Cross traffic: m FTP/Reno flows N1 -> N5 starting uniformly in [0, cross_start_s).
# Ours: n FTP/Reno flows N2 -> N6 starting together at start_s.
# Every flow's acked packets, retransmissions and smoothed RTT are reported over the window
# [measure_from_s, measure_to_s]; the aggregate of each group is also reported every interval_s.
# Usage: ns ns2_scenario.tcl key value ... (all keys below are required; see probes/ns2.py).

set required {seed l3_bw l3_delay access_bw l1_delay l4_delay queue_pkts queue window_pkts \
    cross_window_pkts packet_bytes m n cross_start_s start_s measure_from_s measure_to_s interval_s}
if {[llength $argv] % 2 != 0} {
    puts stderr "arguments must be key value pairs"
    exit 2
}
array set opt $argv
foreach key $required {
    if {![info exists opt($key)]} {
        puts stderr "missing argument: $key"
        exit 2
    }
}

# One RNG for everything random in the run, so the seed alone decides the outcome.
global defaultRNG
$defaultRNG seed $opt(seed)
set startRng [new RNG]
$startRng seed $opt(seed)

set ns [new Simulator]

Queue set limit_ $opt(queue_pkts)
Agent/TCP set packetSize_ $opt(packet_bytes)
Agent/TCP set tcpTick_ 0.001
Agent/TCP set timestamps_ true
Agent/TCP set overhead_ 0.0

set n1 [$ns node]
set n2 [$ns node]
set n3 [$ns node]
set n4 [$ns node]
set n5 [$ns node]
set n6 [$ns node]

$ns duplex-link $n1 $n3 $opt(access_bw) $opt(l1_delay) $opt(queue)
$ns duplex-link $n2 $n3 $opt(access_bw) $opt(l1_delay) $opt(queue)
$ns duplex-link $n3 $n4 $opt(l3_bw) $opt(l3_delay) $opt(queue)
$ns duplex-link $n4 $n5 $opt(access_bw) $opt(l4_delay) $opt(queue)
$ns duplex-link $n4 $n6 $opt(access_bw) $opt(l4_delay) $opt(queue)

proc make_flow {src dst window fid start} {
    global ns
    set tcp [new Agent/TCP/Reno]
    $tcp set window_ $window
    $tcp set maxcwnd_ $window
    $tcp set fid_ $fid
    set sink [new Agent/TCPSink]
    $ns attach-agent $src $tcp
    $ns attach-agent $dst $sink
    $ns connect $tcp $sink
    set ftp [new Application/FTP]
    $ftp attach-agent $tcp
    $ns at $start "$ftp start"
    return $tcp
}

set cross {}
for {set i 0} {$i < $opt(m)} {incr i} {
    set t [$startRng uniform 0 $opt(cross_start_s)]
    lappend cross [make_flow $n1 $n5 $opt(cross_window_pkts) [expr {1000 + $i}] $t]
}
set ours {}
for {set i 0} {$i < $opt(n)} {incr i} {
    lappend ours [make_flow $n2 $n6 $opt(window_pkts) [expr {$i + 1}] $opt(start_s)]
}

# srtt_ is kept in ticks scaled by 2^3 (tcp.h T_SRTT_BITS); 0 until the first RTT sample.
proc srtt_s {tcp} {
    return [expr {[$tcp set srtt_] / 8.0 * [$tcp set tcpTick_]}]
}

proc snapshot {label} {
    global ns cross ours
    set now [$ns now]
    foreach {group flows} [list cross $cross ours $ours] {
        set i 0
        foreach tcp $flows {
            puts [format "%s %.6f %s %d %d %d %.6f" $label $now $group $i \
                [$tcp set ack_] [$tcp set nrexmitpack_] [srtt_s $tcp]]
            incr i
        }
    }
}

# RTT samples inside the window, so the reported RTT is the window's mean, not the last value.
proc sample_rtt {} {
    global ns opt
    snapshot tick
    set next [expr {[$ns now] + $opt(interval_s)}]
    if {$next < $opt(measure_to_s) - 1e-9} {
        $ns at $next "sample_rtt"
    }
}

puts [format "config seed %s m %d n %d from %.6f to %.6f packet_bytes %d" \
    $opt(seed) $opt(m) $opt(n) $opt(measure_from_s) $opt(measure_to_s) $opt(packet_bytes)]
$ns at $opt(measure_from_s) "snapshot begin; sample_rtt"
$ns at $opt(measure_to_s) "snapshot end"
$ns at [expr {$opt(measure_to_s) + 1e-6}] "puts done; exit 0"
$ns run
