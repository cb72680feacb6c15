# The scenario of ns2_scenario.tcl with one more flow of ours: a fractional stream (Hacker et al. 2004,
# Fu and Indulska's FM): a Reno flow whose window grows by increase_num_ = 1/FM segments a round trip
# instead of 1, so that at the same loss rate and RTT it moves about 1/sqrt(FM) of a standard stream.
# Usage: ns ns2_fractional.tcl fractional_increase A key value ... (A = 1/FM, then the scenario's keys).
# The flow starts with ours and is reported as our last flow: it joins the list `ours` as soon as the
# scenario has made its n standard flows (a trace on that list), so the scenario script runs unchanged.

array set fractional $argv
if {![info exists fractional(fractional_increase)] || $fractional(fractional_increase) <= 0} {
    puts stderr "missing or non-positive argument: fractional_increase"
    exit 2
}
set fractional_added 0

proc add_fractional_stream {name1 name2 op} {
    global ours opt n2 n6 fractional fractional_added
    if {$fractional_added || [llength $ours] != $opt(n)} {
        return
    }
    set fractional_added 1
    set tcp [make_flow $n2 $n6 $opt(window_pkts) [expr {$opt(n) + 1}] $opt(start_s)]
    $tcp set increase_num_ $fractional(fractional_increase)
    lappend ours $tcp
}

trace add variable ours write add_fractional_stream
source [file join [file dirname [info script]] ns2_scenario.tcl]
