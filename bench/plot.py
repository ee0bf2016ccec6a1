"""Latency-vs-load PNG of a suite result (matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

_STYLE = {"echo": ("tab:gray", "NATS echo (floor)"), "direct": ("tab:olive", "direct responder (Python floor)"),
          "inferbus miss": ("tab:blue", "inferbus, cache miss"),
          "inferbus hit": ("tab:green", "inferbus, cache hit"), "ray": ("tab:red", "Ray Serve")}


def plot(result: dict, path: Path) -> Path | None:
    """Write p50 and p99 latency against achieved QPS for every series; None when matplotlib is absent.

    Open-loop points are joined by lines (one per series), closed-loop points
    are drawn as markers labelled with their concurrency.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    steps = result.get("steps", [])
    for series, (color, name) in _STYLE.items():
        pts = [s for s in steps if s.get("series") == series]
        if not pts:
            continue
        opened = sorted((s for s in pts if s["mode"] == "open"), key=lambda s: s["qps"])
        closed = [s for s in pts if s["mode"] == "closed"]
        for ax, key in zip(axes, ("p50_us", "p99_us")):
            if opened:
                ax.plot([s["qps"] for s in opened], [s[key] / 1000 for s in opened], "-o", color=color, ms=4,
                        label=f"{name} (open loop)")
            if closed:
                ax.scatter([s["qps"] for s in closed], [s[key] / 1000 for s in closed], marker="s", color=color,
                           facecolors="none", label=f"{name} (closed loop)")
                for s in closed:
                    ax.annotate(f"c={s['concurrency']}", (s["qps"], s[key] / 1000), fontsize=7, color=color,
                                xytext=(3, 3), textcoords="offset points")
    meta = result.get("meta", {})
    for ax, what in zip(axes, ("p50", "p99")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("achieved requests/s")
        ax.set_ylabel(f"{what} latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        if what == "p99":
            ax.axhline(5.0, color="black", lw=0.8, ls="--")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"inferbus bench — {meta.get('model', '')}, {meta.get('profile', '')} profile, "
                 f"{meta.get('nproc', '?')} cores ({meta.get('cpu_model', '')}), {meta.get('date', '')}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
