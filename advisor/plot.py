"""Draws a predicted curve (throughput and impact vs streams, probes marked) to a PNG file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def plot_curve(curve: Sequence[dict[str, Any]], probes: Sequence[dict[str, Any]], title: str, path: Path) -> None:
    """`curve`: {streams, throughput_bps, impact, impact_bound}; `probes`: {streams, throughput_bps}. Writes `path` (PNG), exactly; OSError when it cannot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = [p["streams"] for p in curve]
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot(streams, [p["throughput_bps"] / 1e6 for p in curve], color="tab:blue", label="predicted throughput")
    if probes:
        left.scatter([p["streams"] for p in probes], [p["throughput_bps"] / 1e6 for p in probes],
                     color="black", zorder=3, label="probes")
    left.set_xlabel("parallel streams")
    left.set_ylabel("throughput (Mbit/s)", color="tab:blue")
    right = left.twinx()
    right.plot(streams, [100 * p["impact"] for p in curve], color="tab:orange", label="impact on competing flows")
    right.plot(streams, [100 * p["impact_bound"] for p in curve], color="tab:orange", linestyle=":",
               label="impact with the margin for error")
    right.set_ylabel("impact on each competing flow (%)", color="tab:orange")
    right.set_ylim(0, 100)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles, [h.get_label() for h in handles], loc="center right")
    left.set_title(title)
    fig.tight_layout()
    try:
        # format given: matplotlib would otherwise pick it from the suffix, or add ".png" to a path without one.
        fig.savefig(path, dpi=100, format="png")
    finally:
        plt.close(fig)
