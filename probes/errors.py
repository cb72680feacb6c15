"""Errors raised by probe drivers; every one means no result was kept."""


class ProbeError(Exception):
    """Base class: a probe could not produce a result."""


class HostUnresolvable(ProbeError):
    """The destination host name does not resolve."""


class NothingListening(ProbeError):
    """The destination refused the connection: no iperf3 server on that port."""


class ServerBusy(ProbeError):
    """The iperf3 server is running another test."""


class ProbeDeadlineExceeded(ProbeError):
    """The probe did not finish before its deadline and was killed."""


class ZeroThroughput(ProbeError):
    """The probe finished but moved no data."""


class SimulatorError(ProbeError):
    """The network simulator failed or produced output that cannot be read."""
