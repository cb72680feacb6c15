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


class TransferFailed(ProbeError):
    """An iperf3 client of a transfer failed, or ran under another congestion control than it asked for."""


class TransferCancelled(ProbeError):
    """A transfer's caller cancelled it (e.g. a scheduler interrupted); its clients were stopped."""


class SimulatorError(ProbeError):
    """The network simulator failed or produced output that cannot be read."""


class CcError(Exception):
    """Base class: the tame congestion control could not be built, registered, set or inspected."""


class CcUnavailable(CcError):
    """This machine cannot build or run the control (no BTF, clang or bpftool)."""


class CcNotRoot(CcError):
    """The operation needs root and the process is not root."""


class CcNotLoaded(CcError):
    """The control is not registered, so it has no settings to read or change."""


class CcOutdated(CcError):
    """The registered control is an older build whose FM map this one cannot read or write (registration outlives an
    upgrade): it must be unloaded and loaded again."""


class CcBusy(CcError):
    """Another process (a tame transfer, an apply) is setting the same destination's FM."""


class CcMapFull(CcError):
    """The FM map holds as many entries as it can, of every network namespace: one must be cleared first."""


class CcLivenessUnknown(CcError):
    """Not every live network namespace could be seen (another PID namespace, a process that cannot be read), so no
    FM entry can be called a gone namespace's."""


class CcRouteConflict(CcError):
    """The destination's route cannot carry the control (a route tame did not add, or a local address)."""


class CcNotAVrf(CcError):
    """A VRF named for the routes (--vrf) is not a device of this network namespace, or is one that is not a VRF."""


class CcCommandFailed(CcError):
    """bpftool or ip failed or passed its deadline."""
