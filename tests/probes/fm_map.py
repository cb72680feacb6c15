"""Filling the tame FM map on the real kernel, for the tests of what a full map does (root; tame registered)."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from probes import cc, cc_map


def fill_with_entries_of(netns_cookie: int, work_dir: Path) -> int:
    """Fill the registered FM map to its 4,096 entries with entries of ``netns_cookie``'s sockets to 10.66.x.y
    (FM 2), in one bpftool batch; returns how many were added."""
    reg, value = cc.registration(), " ".join(f"{x:02x}" for x in cc_map.CcSetting(2.0).to_value())
    count = 4096 - len(cc_map.all_settings())
    batch = work_dir / "fill"
    batch.write_text("".join(
        f"map update id {reg.fm_map_id} key hex "
        f"{' '.join(f'{x:02x}' for x in cc_map.map_key(ipaddress.ip_address(f'10.66.{i // 256}.{i % 256}'), netns_cookie))} "
        f"value hex {value}\n" for i in range(count)))
    subprocess.run(["bpftool", "batch", "file", str(batch)], check=True, capture_output=True, timeout=60)
    assert len(cc_map.all_settings()) == 4096
    return count
