"""The conformance kit: run every generic property on one loss and report each as passed or failed.

    from prefzoo.testing import check_loss
    report = check_loss("cal-dpo", max_examples=100)
    print(report.table()); assert report.passed, report.failures_text()

or, in a plugin's test suite, ``test_my_loss = conformance_tests("my-loss")``
(one pytest test per property), or ``prefzoo check my-loss`` on the command line.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from prefzoo.spec import Loss, LossSpec
from prefzoo.testing.properties import GENERIC_PROPERTIES, Property, check_low_precision, check_matches_reference
from prefzoo.testing.properties_shapes import LIST_PROPERTIES, UNPAIRED_PROPERTIES, check_shape_low_precision
from prefzoo.testing.strategies import DTYPES, batches_for, loss_params
from prefzoo.types import PreferenceBatch, Shape

__all__ = ["ALL_PROPERTIES", "ConformanceReport", "PropertyResult", "check_loss", "conformance_tests",
           "dtypes_from_env"]

# every shape's properties; each is checked on the losses that accept its shape (Property.applies_to)
ALL_PROPERTIES: tuple[Property, ...] = (*GENERIC_PROPERTIES, *LIST_PROPERTIES, *UNPAIRED_PROPERTIES)

DTYPES_ENV = "PREFZOO_TEST_DTYPES"  # e.g. "bfloat16" or "float64,float32": what the tox props-* envs select


def dtypes_from_env(default: tuple[str, ...] = ("float64", "float32", "bfloat16")) -> tuple[str, ...]:
    """Dtypes selected by ``PREFZOO_TEST_DTYPES`` (comma-separated names), else ``default``."""
    raw = os.environ.get(DTYPES_ENV, "").strip()
    if not raw:
        return default
    names = tuple(x.strip() for x in raw.split(",") if x.strip())
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise ValueError(f"{DTYPES_ENV}={raw!r}: unknown dtype {unknown[0]!r}; use {', '.join(DTYPES)}")
    return names


@dataclass
class PropertyResult:
    name: str
    guarantee: str
    status: str  # "passed", "failed", "error" (the loss raised), "n/a" (does not apply to this loss)
    examples: int = 0
    seconds: float = 0.0
    message: str = ""
    falsifying_example: str = ""


@dataclass
class ConformanceReport:
    loss: str
    plugin: str
    results: list[PropertyResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.status in ("passed", "n/a") for r in self.results)

    def failures(self) -> list[PropertyResult]:
        return [r for r in self.results if r.status not in ("passed", "n/a")]

    def table(self) -> str:
        """A fixed-width table: property, status, examples, time, guarantee."""
        w = max([len(r.name) for r in self.results] + [8])
        lines = [f"conformance of loss {self.loss!r} (plugin {self.plugin})",
                 f"{'property':<{w}}  {'status':<7}  {'examples':>8}  {'time':>6}  guarantee",
                 f"{'-' * w}  {'-' * 7}  {'-' * 8}  {'-' * 6}  {'-' * 40}"]
        for r in self.results:
            lines.append(f"{r.name:<{w}}  {r.status.upper():<7}  {r.examples:>8}  {r.seconds:>5.1f}s  {r.guarantee}")
        lines.append(f"{'PASSED' if self.passed else 'FAILED'}: {self.tally()}")
        return "\n".join(lines)

    def tally(self) -> str:
        """``"9 passed, 21 not applicable"``: the properties that held, failed (or raised) and did not apply, each
        count shown when it is not 0 (passed always)."""
        n_na = sum(r.status == "n/a" for r in self.results)
        n_fail = len(self.failures())
        counts = [(len(self.results) - n_fail - n_na, "passed"), (n_fail, "failed"), (n_na, "not applicable")]
        return ", ".join(f"{n} {what}" for i, (n, what) in enumerate(counts) if n or i == 0)

    def failures_text(self) -> str:
        out = []
        for r in self.failures():
            out.append(f"--- {r.name} ({r.status}): {r.message}\n    falsifying example: {r.falsifying_example}")
        return "\n".join(out)

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise AssertionError(f"{self.table()}\n{self.failures_text()}")


def describe_batch(batch: Any, params: Any, limit: int = 8) -> str:
    """A reproducible description of a batch of any shape (values in full precision) and params."""
    first = batch.policy_chosen_logps if isinstance(batch, PreferenceBatch) else batch.policy_logps
    parts = [f"params={params!r}", f"{type(batch).__name__}", f"B={batch.batch_size}", f"dtype={first.dtype}"]
    for name in type(batch).__dataclass_fields__:
        t = getattr(batch, name)
        if isinstance(t, torch.Tensor):
            vals = t.detach().flatten().tolist()
            more = f", ... ({len(vals)} values)" if len(vals) > limit else ""
            parts.append(f"{name}={vals[:limit]!r}{more}")
    return "; ".join(parts)


def _resolve(obj: str | Loss | LossSpec) -> tuple[LossSpec, Any | None]:
    """(spec, fixed params or None to draw them)."""
    if isinstance(obj, Loss):
        return obj.spec, obj.params
    if isinstance(obj, LossSpec):
        return obj, None
    from prefzoo.registry import loss_spec

    return loss_spec(obj), None


def _builtin_reference(spec: LossSpec) -> tuple[Callable[[PreferenceBatch, Any], Any], bool] | None:
    if not spec.builtin:
        return None
    from prefzoo.testing.reference import REFERENCES, to_float64

    if spec.name not in REFERENCES:
        return None
    fn, mean_only = REFERENCES[spec.name]
    return (lambda b, p: fn(to_float64(b), p)), mean_only


def check_loss(
    name_or_loss: str | Loss | LossSpec,
    *,
    max_examples: int | None = None,
    dtypes: Iterable[str] | None = None,
    properties: Iterable[str] | None = None,
    reference: Callable[[PreferenceBatch, Any], Any] | None = None,
    max_batch: int = 64,
    derandomize: bool | None = None,
) -> ConformanceReport:
    """Run the generic properties on a loss and report each with its falsifying example.

    ``name_or_loss``: a registered name, a :class:`LossSpec` (params are drawn
    from its declared ranges) or a bound :class:`Loss` (params fixed).
    ``max_examples`` defaults to the active Hypothesis profile's.  ``reference``
    is an optional float64 formula ``reference(batch, params) -> (B,)`` to
    compare against (built-in losses use prefzoo's own).
    """
    spec, fixed = _resolve(name_or_loss)
    dts = tuple(dtypes) if dtypes is not None else dtypes_from_env()
    wanted = set(properties) if properties is not None else None
    props = list(ALL_PROPERTIES)
    ref = (reference, False) if reference is not None else _builtin_reference(spec)
    if ref is not None:
        fn, mean_only = ref
        props.append(Property("reference", "losses equal a float64 reference formula of the paper",
                              functools.partial(_check_reference, fn=fn, mean_only=mean_only)))
    if wanted is not None:
        unknown = wanted - {p.name for p in props}
        if unknown:
            raise ValueError(f"unknown property {sorted(unknown)[0]!r}; known: {', '.join(p.name for p in props)}")
        props = [p for p in props if p.name in wanted]
    report = ConformanceReport(loss=spec.name, plugin=spec.plugin)
    base = settings()
    n = max_examples if max_examples is not None else base.max_examples
    for prop in props:
        report.results.append(_run_property(prop, spec, fixed, n, dts, max_batch,
                                            base.derandomize if derandomize is None else derandomize))
    return report


def _check_reference(
    loss: Loss, b: PreferenceBatch, *, fn: Callable[[PreferenceBatch, Any], Any], mean_only: bool
) -> None:
    check_matches_reference(loss, b, fn, mean_only)


class FreshStateLoss(Loss):
    """A stateful loss called from its initial state every time: a property is about one call, and its checks call
    the loss several times on related batches (a sharded run after the full one, threads at once)."""

    def __call__(self, batch: Any, gather: Callable[..., Any] | None = None,
                 update_state: bool | None = None) -> Any:  # fmt: skip
        return Loss(self.spec, self.params)(batch, gather=gather, update_state=update_state)


def _bind(spec: LossSpec, params: Any) -> Loss:
    return FreshStateLoss(spec, params) if spec.stateful else Loss(spec, params)


def _run_property(prop: Property, spec: LossSpec, fixed: Any, n: int, dts: tuple[str, ...], max_batch: int,
                  derandomize: bool) -> PropertyResult:
    res = PropertyResult(prop.name, prop.guarantee, "n/a")
    if not prop.applies_to(spec):
        return res
    if fixed is not None:
        if prop.params_filter is not None and not prop.params_filter(spec, fixed):
            return res
        params_st: st.SearchStrategy[Any] = st.just(fixed)
    else:
        params_st = loss_params(spec)
        if prop.params_filter is not None:
            f = prop.params_filter
            params_st = params_st.filter(lambda p: f(spec, p))
    batch_dts = dts
    check = prop.check
    if prop.name.endswith("low-precision"):  # draw float64 values, compare the requested low-precision dtypes
        low = tuple(DTYPES[d] for d in dts if d != "float64") or (torch.float32,)
        batch_dts = ("float64",)
        lp = check_low_precision if prop.shape is Shape.PAIR else check_shape_low_precision
        check = lambda loss, b: lp(loss, b, low)  # noqa: E731
    last: dict[str, Any] = {}
    count = [0]

    @settings(max_examples=n, deadline=None, database=None, derandomize=derandomize, report_multiple_bugs=False,
              phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(batch=batches_for(spec, prop.shape, dtypes=batch_dts, max_size=max_batch), params=params_st)
    def run(batch: Any, params: Any) -> None:
        count[0] += 1
        loss = fixed_loss if fixed_loss is not None else _bind(spec, params)
        try:
            check(loss, batch)
        except BaseException as e:
            last["example"] = describe_batch(batch, loss.params)
            last["error"] = e
            raise

    fixed_loss = _bind(spec, fixed) if fixed is not None else None
    t0 = time.perf_counter()
    try:
        run()
        res.status = "passed"
    except AssertionError as e:
        res.status, res.message = "failed", str(last.get("error", e)).splitlines()[0]
    except Exception as e:  # the loss itself raised: report it, do not crash the kit
        err = last.get("error", e)
        res.status, res.message = "error", f"{type(err).__name__}: {err}".splitlines()[0]
    res.falsifying_example = last.get("example", "") if res.status != "passed" else ""
    res.examples = count[0]
    res.seconds = time.perf_counter() - t0
    return res


def conformance_tests(name_or_loss: str | Loss | LossSpec, **kw: Any) -> Callable[..., None]:
    """A pytest test function parametrized over the generic properties, for a plugin's own test module.

    ``test_my_loss = conformance_tests("my-loss")`` yields one test per property;
    a failure shows the property's message and falsifying example.
    """
    import pytest

    names = [p.name for p in ALL_PROPERTIES] + ["reference"]

    @pytest.mark.parametrize("property_name", names)
    def test_conformance(property_name: str) -> None:
        spec, _ = _resolve(name_or_loss)
        has_ref = kw.get("reference") is not None or _builtin_reference(spec) is not None
        if property_name == "reference" and not has_ref:
            pytest.skip("no reference formula given (pass reference=fn to conformance_tests)")
        report = check_loss(name_or_loss, properties=[property_name], **kw)
        if report.results and report.results[0].status == "n/a":
            pytest.skip(f"property {property_name!r} does not apply to {spec.name!r}")
        report.raise_if_failed()

    return test_conformance
