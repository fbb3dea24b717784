"""Server-side plots as self-contained inline SVG (no external assets, no pyplot).

Why SVG inline: the report must be one file an auditor can archive, print and search; vector
plots stay sharp when printed. Why no pyplot: pyplot keeps global figure state and picks a GUI
backend; here every plot is a private ``Figure`` drawn by an explicit Agg/SVG canvas inside a
temporary ``rc_context``, under a lock because matplotlib's rcParams are process-global and the
API renders from a thread pool.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from privtrain_common.directed_rounding import format_guarantee

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

_LOCK = threading.Lock()
_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "path",  # glyphs as paths: no fonts needed by the viewer
    "svg.hashsalt": "privtrain",  # deterministic element ids
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_SVG_METADATA = {"Creator": None, "Date": None, "Format": None, "Type": None}
_COLOURS = {"committed": "#1f5fa8", "total": "#e07b00", "budget": "#b00020", "line": "#1f5fa8", "mark": "#b00020"}


def _new_figure(width: float = 6.4, height: float = 3.2) -> Figure:
    import matplotlib

    matplotlib.use("Agg")  # never a GUI backend in a server; a no-op once set
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _to_inline_svg(figure: Figure, *, prefix: str) -> str:
    """The figure as an ``<svg>`` element for inline use: no XML prolog or DOCTYPE, and every
    element id prefixed so several plots in one page cannot collide."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata=_SVG_METADATA)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    for element_id in sorted(ids, key=len, reverse=True):
        new = f"{prefix}-{element_id}"
        svg = svg.replace(f'id="{element_id}"', f'id="{new}"')
        svg = svg.replace(f'"#{element_id}"', f'"#{new}"')
        svg = svg.replace(f"url(#{element_id})", f"url(#{new})")
    return svg


def _render(draw: Callable[[Figure], None], *, prefix: str, width: float = 6.4, height: float = 3.2) -> str:
    import matplotlib

    with _LOCK, matplotlib.rc_context(_RC):
        figure = _new_figure(width, height)
        draw(figure)
        return _to_inline_svg(figure, prefix=prefix)


def epsilon_vs_steps_svg(
    *,
    steps: Sequence[int],
    epsilon: Sequence[float],
    final_steps: int,
    final_ledger: float,
    final_prv: float | None,
    delta: float,
    prefix: str = "eps-steps",
) -> str:
    """ε (ledger conversion) of the first k training steps, with the job's final numbers marked."""

    def draw(figure: Figure) -> None:
        axes = figure.add_subplot()
        axes.plot(steps, epsilon, color=_COLOURS["line"], label="ledger ε, first k steps")
        axes.plot([final_steps], [final_ledger], "o", color=_COLOURS["mark"], label="committed ε (ledger)")
        if final_prv is not None:
            axes.plot(
                [final_steps], [final_prv], "s", color=_COLOURS["committed"], mfc="white", label="PRV bound (this job)"
            )
        axes.set_xlabel("training steps k")
        axes.set_ylabel(f"ε at δ = {format_guarantee(delta, digits=3)}")  # δ of a guarantee: rounded up
        axes.set_xlim(left=0)
        axes.set_ylim(bottom=0)
        figure.legend(loc="outside lower center", ncols=3, frameon=False, fontsize=8)

    return _render(draw, prefix=prefix, height=3.5)


def rdp_curve_svg(*, orders: Sequence[float], values: Sequence[float], prefix: str = "rdp") -> str:
    """The job's Rényi-DP curve on the ledger's order grid (log–log)."""

    def draw(figure: Figure) -> None:
        axes = figure.add_subplot()
        positive = [(a, v) for a, v in zip(orders, values, strict=True) if v > 0]
        if positive:
            xs, ys = zip(*positive, strict=True)
            axes.plot(xs, ys, "o-", color=_COLOURS["line"], markersize=3)
            axes.set_yscale("log")
        axes.set_xscale("log")
        axes.set_xlabel("Rényi order α")
        axes.set_ylabel("RDP ε(α)")

    return _render(draw, prefix=prefix)


def ledger_timeline_svg(
    *,
    times: Sequence[dt.datetime],
    committed: Sequence[float],
    total: Sequence[float],
    budget: Sequence[float],
    marker_index: int | None = None,
    prefix: str = "ledger",
) -> str:
    """Cumulative ε of committed and of committed + reserved entries over time, and the budget."""

    def draw(figure: Figure) -> None:
        from matplotlib.dates import AutoDateLocator, DateFormatter

        axes = figure.add_subplot()
        # matplotlib's stubs type x as ArrayLike; its date units accept datetimes at runtime.
        axes.step(
            times,  # type: ignore[arg-type]
            budget,
            where="post",
            color=_COLOURS["budget"],
            linestyle="--",
            label="budget ε_G",
        )
        axes.step(
            times,  # type: ignore[arg-type]
            total,
            where="post",
            color=_COLOURS["total"],
            label="committed + reserved",
        )
        axes.step(
            times,  # type: ignore[arg-type]
            committed,
            where="post",
            color=_COLOURS["committed"],
            label="committed",
        )
        if marker_index is not None and 0 <= marker_index < len(times):
            axes.plot(
                [times[marker_index]],  # type: ignore[arg-type]
                [committed[marker_index]],
                "o",
                color=_COLOURS["mark"],
                label="this job's COMMIT",
            )
        axes.xaxis.set_major_locator(AutoDateLocator(maxticks=6))  # type: ignore[no-untyped-call]  # untyped module
        # Whole readable times, never bare seconds with an offset: a day or less shows clock
        # times, a longer span month-day and time.
        span = (max(times) - min(times)) if times else dt.timedelta(0)
        axes.xaxis.set_major_formatter(
            DateFormatter(  # type: ignore[no-untyped-call]  # untyped module
                "%H:%M:%S" if span <= dt.timedelta(days=1) else "%m-%d %H:%M",
                tz=dt.UTC,
            )
        )
        axes.set_xlabel("time (UTC)")
        axes.set_ylabel("ε at the budget's δ")
        axes.set_ylim(bottom=0)
        figure.legend(loc="outside lower center", ncols=4, frameon=False, fontsize=8)

    return _render(draw, prefix=prefix, height=3.5)
