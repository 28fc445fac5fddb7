"""The loss interface: a params dataclass, a spec describing a loss, and the callable Loss.

A loss is a pure function ``fn(batch, params, ctx) -> LossOutput``; ``LossSpec.shapes``
declares which batch it takes (pairs: PreferenceBatch, the default; lists: GroupBatch;
unpaired: UnpairedBatch) and :class:`LossOutput` documents what it returns per shape.  Its params
are a frozen, keyword-only dataclass deriving from :class:`LossParams` whose
fields are declared with :func:`param`, so that their range and meaning are data:
validation, the CLI, the docs catalogue and the Hypothesis strategies all read
them from one place.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prefzoo.types import (
    NEED_FIELDS,
    AnyBatch,
    GroupBatch,
    LossContext,
    LossOutput,
    LossState,
    Need,
    PreferenceBatch,
    PreferenceBatchError,
    Shape,
    group_from_pairs,
    shape_of,
)

__all__ = [
    "Applicability",
    "InnerLoss",
    "Loss",
    "LossOutputError",
    "LossParamError",
    "LossParams",
    "LossSpec",
    "ModifierError",
    "ModifierFn",
    "ModifierSpec",
    "ParamError",
    "ParamInfo",
    "param",
    "param_infos",
    "parse_assignments",
    "read_literal",
    "read_scalar",
    "tex_to_text",
    "text_of",
    "value_type",
]


class ParamError(ValueError):
    """A malformed ``KEY=VALUE`` option (loss parameter, judge option, config value)."""


class LossParamError(ParamError):
    """An unknown, malformed or out-of-range loss hyperparameter."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_assignments(pairs: Iterable[str], flag: str, example: str = "key=value") -> dict[str, str]:
    """``["beta=0.1", "loss_type = sigmoid"]`` -> ``{"beta": "0.1", "loss_type": "sigmoid"}``: the one KEY=VALUE parser.

    Used by ``--loss-param``, ``--judge-param`` and the values of YAML files; the caller converts each
    text to its type (:func:`read_scalar`, :meth:`LossSpec.parse_param`).  A pair without ``=`` or with an
    empty key is a :class:`LossParamError` naming ``flag``.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, text = str(pair).partition("=")
        if not eq or not key.strip():
            raise LossParamError(f"{flag} {pair!r}: expected KEY=VALUE, e.g. {flag} {example}")
        out[key.strip()] = text.strip()
    return out


def read_scalar(text: str, typ: Any) -> Any:
    """``text`` read as ``typ`` (bool, int, float or str); a ValueError when it is not one."""
    if typ is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(text)
    if typ in (int, float, str):
        return typ(text)
    return text


def value_type(typ: Any) -> tuple[Any, bool]:
    """(underlying type, optional?) for ``float``, ``float | None``, ``Optional[int]``...; ``Any`` for a union of two
    types or more."""
    if typing.get_origin(typ) is typing.Union or isinstance(typ, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        return (args[0] if len(args) == 1 else Any), len(args) < len(typing.get_args(typ))
    return typ, False


_NONE = ("none", "null")


def read_literal(text: str) -> Any:
    """An untyped option value: a JSON literal (``3``, ``0.5``, ``true``, ``[1, 2]``) if it is one, else the string."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class LossOutputError(RuntimeError):
    """A loss function returned something that breaks the LossOutput contract."""


@dataclass(frozen=True)
class ParamInfo:
    """What is known about one hyperparameter: read by validation, CLI, docs and strategies."""

    name: str
    type: Any
    default: Any
    doc: str
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None

    def range_text(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        lo = f"> {self.gt}" if self.gt is not None else f">= {self.ge}" if self.ge is not None else ""
        hi = f"< {self.lt}" if self.lt is not None else f"<= {self.le}" if self.le is not None else ""
        return " and ".join(x for x in (lo, hi) if x) or "any finite value"

    def check(self, value: Any) -> str | None:
        """None when ``value`` is valid, else the reason."""
        if self.choices is not None:
            return None if value in self.choices else f"must be {self.range_text()}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {type(value).__name__} {value!r}"
        if not math.isfinite(value):
            return "must be finite"
        ok = (
            (self.gt is None or value > self.gt)
            and (self.ge is None or value >= self.ge)
            and (self.lt is None or value < self.lt)
            and (self.le is None or value <= self.le)
        )
        return None if ok else f"must be {self.range_text()}"


def param(
    default: Any,
    doc: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    choices: Iterable[Any] | None = None,
) -> Any:
    """Declare a loss hyperparameter with its default, meaning and valid range."""
    meta = {
        "prefzoo": {
            "doc": doc,
            "gt": gt,
            "ge": ge,
            "lt": lt,
            "le": le,
            "choices": tuple(choices) if choices is not None else None,
        }
    }
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class LossParams:
    """Base of every loss's params class: validates each declared field on construction."""

    def __post_init__(self) -> None:
        for info in param_infos(type(self)):
            value = getattr(self, info.name)
            if value is None and info.default is None:
                continue  # an optional parameter left unset
            if info.type is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, info.name, float(value))
                value = float(value)
            why = info.check(value)
            if why is not None:
                doc = text_of(info.doc)
                raise LossParamError(f"{type(self).__name__}: parameter {info.name!r} = {value!r} {why} ({doc})")
        self.check()

    def check(self) -> None:
        """Cross-field validation; raise LossParamError naming the fields."""

    def fail(self, message: str) -> typing.NoReturn:
        raise LossParamError(f"{type(self).__name__}: {message}")


def param_infos(cls: type) -> list[ParamInfo]:
    """The declared hyperparameters of a params class, in declaration order."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("prefzoo", {})
        typ = hints.get(f.name, Any)
        out.append(
            ParamInfo(
                name=f.name,
                type=typ,
                default=f.default,
                doc=meta.get("doc", ""),
                gt=meta.get("gt"),
                ge=meta.get("ge"),
                lt=meta.get("lt"),
                le=meta.get("le"),
                choices=meta.get("choices") or _literal_choices(typ),
            )
        )
    return out


def _literal_choices(typ: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(typ) is typing.Literal:
        return typing.get_args(typ)
    return None


_TEX_SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "varepsilon": "ε", "epsilon": "ε",
    "theta": "θ", "lambda": "λ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "psi": "ψ", "sum": "Σ",
    "cdot": "·", "leftarrow": "←", "le": "≤", "ell": "ℓ", "lfloor": "⌊", "rfloor": "⌋",
    "mid": "|", "lvert": "|", "rvert": "|", "geq": "≥", "ge": "≥", "leq": "≤", "gt": ">", "lt": "<",
    "equiv": "≡", "approx": "≈", "nabla": "∇", "partial": "∂", "to": "→", "infty": "∞", "Vert": "‖", "ln": "ln",
    "log": "log", "exp": "exp", "max": "max", "min": "min", "quad": " ", "qquad": " ",
}
_TEX_DROPPED = ("left", "right", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr")
_TEX_FUNCTIONS = ("log", "exp", "max", "min", "ln")  # a space after them when a name follows: \log\sigma -> "log σ"
# commands whose following space is printed: functions, spacing and relations (\leftarrow w -> "← w")
_TEX_SPACED = (
    *_TEX_FUNCTIONS, "quad", "qquad", "leftarrow", "equiv", "approx", "to", "geq", "ge", "leq", "le", "gt", "lt",
)


def _command_end(tex: str, i: int) -> int:
    """The index after the letters of the command whose backslash is at ``i`` (``i + 1`` for ``\\{`` and the like)."""
    j = i + 1
    while j < len(tex) and tex[j].isalpha():
        j += 1
    return j


def _tex_group(tex: str, i: int) -> tuple[str, int]:
    """The brace group (or single character) of ``tex`` at ``i``, without its braces, and the index after it."""
    if tex[i] == "\\":  # a command: \\theta
        j = _command_end(tex, i)
        return tex[i : max(j, i + 2)], max(j, i + 2)
    if tex[i] != "{":
        return tex[i], i + 1
    depth = 0
    for j in range(i, len(tex)):
        depth += {"{": 1, "}": -1}.get(tex[j], 0)
        if depth == 0:
            return tex[i + 1 : j], j + 1
    raise ValueError(f"unbalanced braces in formula_tex {tex!r}")


def _atom(text: str) -> bool:
    """Whether ``text`` reads as one numerator without parentheses: no sum or difference outside brackets."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(ch, 0)
        if depth == 0 and text[i : i + 3] in (" + ", " − "):
            return False
    return True


def _frac_text(a: str, b: str) -> str:
    """``\\frac{a}{b}`` as text: a/b, each side parenthesised where it is not one term (½ for one half)."""
    if (a, b) == ("1", "2"):
        return "½"
    wrap_den = not (len(b) <= 1 or b.isdigit() or (b.startswith("|") and b.endswith("|")))
    return (a if _atom(a) else f"({a})") + "/" + (f"({b})" if wrap_den else b)


def tex_to_text(tex: str) -> str:
    r"""The plain-text reading of a formula in LaTeX: what `prefzoo losses NAME` prints for ``formula_tex``.

    Covers the LaTeX the built-in formulas use: Greek letters, ``\log``, ``\frac{a}{b}`` (a/b, parenthesised
    where needed), ``\text{}``/``\mathrm{}``/``\operatorname{}``, ``\hat{H}``, ``\lvert``/``\rvert``, sizing
    (``\left``, ``\bigl``) and spacing commands, sub- and superscripts (``_{ref}`` -> ``_ref``, ``^2`` -> ``²``).
    An unknown command is kept as written (with its backslash), so a test can find it.
    """
    out: list[str] = []
    i = 0
    while i < len(tex):
        ch = tex[i]
        if ch == "\\" and i + 1 < len(tex) and not tex[i + 1].isalpha():
            out.append(" " if tex[i + 1] in ",;: " else tex[i + 1])  # \, \; \  spacing; \{ \} \| literal
            i += 2
            continue
        if ch != "\\":
            out.append({"-": "−", "{": "", "}": ""}.get(ch, ch))
            i += 1
            if ch in "_^" and i < len(tex):
                arg, i = _tex_group(tex, i)
                text = tex_to_text(arg)
                if ch == "^" and text == "2":
                    out[-1] = "²"
                elif len(text) == 1 or all(c.isalnum() or c in ",'" for c in text):
                    out.append(text)
                else:
                    out.append(f"({text})" if ch == "^" else "{" + text + "}")
            continue
        j = _command_end(tex, i)
        name = tex[i + 1 : j]
        if name in ("text", "mathrm", "operatorname", "mathit"):
            arg, j = _tex_group(tex, j)
            out.append(arg if name == "text" else tex_to_text(arg))
        elif name in ("frac", "tfrac", "dfrac"):
            num, j = _tex_group(tex, j)
            den, j = _tex_group(tex, j)
            out.append(_frac_text(tex_to_text(num), tex_to_text(den)))
        elif name == "sqrt":
            arg, j = _tex_group(tex, j)
            inner = tex_to_text(arg)
            out.append("√" + (inner if len(inner) == 1 else f"({inner})"))
        elif name in ("hat", "bar"):
            arg, j = _tex_group(tex, j)
            out.append(tex_to_text(arg) + ("\u0302" if name == "hat" else "\u0304"))
        elif name in _TEX_DROPPED:
            pass
        elif name in _TEX_SYMBOLS:
            out.append(_TEX_SYMBOLS[name])
            if name in _TEX_FUNCTIONS and j < len(tex) and (tex[j].isalpha() or tex[j] == "\\"):
                out.append(" ")
        else:
            out.append("\\" + name)
        if name not in _TEX_SPACED and tex[j : j + 1] == " " and tex[j + 1 : j + 2].isalnum():
            j += 1  # the space that ends a command word (\\mid x) is not printed; one before an operator is
        i = j
    text = " ".join("".join(out).split()).replace("( ", "(").replace(" )", ")")
    return unicodedata.normalize("NFC", re.sub(r"\b(log|exp|max|min) \(", r"\1(", text))  # H + ̂ -> Ĥ


_INLINE_MATH = re.compile(r"\$([^$]+)\$")


def text_of(prose: str) -> str:
    r"""Prose with inline math (``$\beta\cdot\Delta$``) as plain text (``β·Δ``): how the CLI prints a spec's text.

    A spec's prose (``scores``, ``notes``, ``description``, a parameter's doc, what a modifier applies to) writes
    its formulas as ``$...$``, which the docs pages typeset; a terminal and an error message read them through
    :func:`tex_to_text`.  Prose without ``$`` (a plugin's plain text) is returned as it is.
    """
    return _INLINE_MATH.sub(_inline_text, prose)


def _inline_text(match: re.Match[str]) -> str:
    """One ``$...$`` of prose as text; a formula :func:`tex_to_text` cannot read (unbalanced braces in a plugin's
    text) stays as written, dollars included, so a description never stops the CLI."""
    try:
        return tex_to_text(match.group(1))
    except ValueError:
        return match.group(0)


LossFn = Callable[[Any, Any, LossContext], LossOutput]  # (PreferenceBatch | GroupBatch | UnpairedBatch, params, ctx)
PAIRS_ONLY = frozenset({Shape.PAIR})


@dataclass(frozen=True)
class LossSpec:
    """Everything the registry, trainer, docs and property suite know about one loss."""

    name: str  # the value of --loss; lower-case words joined by '-'
    fn: LossFn  # pure function (batch, params, ctx) -> LossOutput
    params_cls: type[LossParams]  # frozen kw-only dataclass with param() fields
    family: str  # e.g. "mmpo", "dpo", "simpo"
    paper: str  # citation with arXiv id or URL
    scores: str  # what chosen_rewards / rejected_rewards are
    needs: frozenset[Need] = frozenset()  # inputs the trainer must compute
    batch_coupled: bool | Callable[[Any], bool] = False  # depends on other examples (ctx.gather), maybe per params
    monotone: bool | Callable[[Any], bool] = True  # ∂L/∂log π(y_w) <= 0 and ∂L/∂log π(y_l) >= 0 (maybe per params)
    shift_invariant: bool = False  # adding c to log π and log π_ref of one response leaves L unchanged
    # permuting the examples permutes the losses (maybe per params); False for a random draw over batch positions
    permutation_equivariant: bool | Callable[[Any], bool] = True
    shapes: frozenset[Shape] = PAIRS_ONLY  # batch types fn takes: PAIR PreferenceBatch, LIST GroupBatch, UNPAIRED ...
    initial_state: Callable[[Any], LossState] | None = None  # stateful losses: params -> the state before step one
    # UNPAIRED: each example's loss is multiplied by UnpairedBatch.density_ratio_weights when given (BCO's
    # underlying-distribution matching); the trainer computes them with --density-ratio, only for such a loss
    density_ratio_weights: bool = False
    # L depends on a pair only through β·Δ (+ terms free of log π), Δ = s_w − s_l with s = log π − log π_ref (log π
    # without a reference), β the parameter `beta`: a target margin m enters as β·Δ − m (maybe per params)
    reward_difference: bool | Callable[[Any], bool] = False
    logp_reward: str = ""  # reference-free: log π(y|x) enters L only as this reward: "sum" (log π) or "average" (/|y|)
    description: str = ""  # one paragraph for `prefzoo losses NAME`
    notes: str = ""  # caveats shown in docs (e.g. gradient identities)
    plugin: str = "?"  # filled in by the registry: which plugin registered it
    builtin: bool = False  # filled in by the registry: registered by a module shipped with prefzoo
    # the per-example loss in LaTeX, in the paper's symbols: the one source of the docs' typeset formula and of
    # ``formula`` (its plain-text reading, :func:`tex_to_text`), which `prefzoo losses NAME` prints
    formula_tex: str = dataclasses.field(default="", kw_only=True)
    # the per-example loss as plain text; derived from ``formula_tex`` when that is given (a value here is then
    # replaced), else the only formula (a plugin may give either)
    formula: str = dataclasses.field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if self.formula_tex:
            object.__setattr__(self, "formula", tex_to_text(self.formula_tex))
        if not dataclasses.is_dataclass(self.params_cls) or not issubclass(self.params_cls, LossParams):
            raise TypeError(f"loss {self.name!r}: params_cls must be a LossParams dataclass, got {self.params_cls!r}")
        if not callable(self.fn):
            raise TypeError(f"loss {self.name!r}: fn is not callable")
        for n in self.needs:
            if not isinstance(n, Need):
                raise TypeError(f"loss {self.name!r}: needs must hold prefzoo.Need values, got {n!r}")
        if not self.shapes or not all(isinstance(x, Shape) for x in self.shapes):
            raise TypeError(f"loss {self.name!r}: shapes must be a non-empty set of prefzoo.Shape, got {self.shapes!r}")

    def accepts(self, shape: Shape) -> bool:
        """Whether :class:`Loss` takes batches of ``shape``: a declared shape, or pairs for a list loss (K = 2)."""
        return shape in self.shapes or (shape is Shape.PAIR and Shape.LIST in self.shapes)

    def is_monotone(self, params: Any) -> bool:
        """Whether the loss declares ∂L/∂log π(y_w) <= 0 and ∂L/∂log π(y_l) >= 0 for these params."""
        return bool(self.monotone(params)) if callable(self.monotone) else bool(self.monotone)

    def is_reward_difference(self, params: Any) -> bool:
        """Whether the loss is a reward-difference loss with β (``reward_difference``) for these params."""
        rd = self.reward_difference
        return bool(rd(params)) if callable(rd) else bool(rd)

    def is_batch_coupled(self, params: Any) -> bool:
        """Whether an example's loss depends on other examples of the batch for these params."""
        return bool(self.batch_coupled(params)) if callable(self.batch_coupled) else bool(self.batch_coupled)

    def is_permutation_equivariant(self, params: Any) -> bool:
        """Whether permuting the examples permutes the per-example losses for these params."""
        pe = self.permutation_equivariant
        return bool(pe(params)) if callable(pe) else bool(pe)

    @property
    def needs_reference(self) -> bool:
        return Need.REFERENCE in self.needs

    @property
    def stateful(self) -> bool:
        """Whether the loss carries state from call to call (ctx.state in, LossOutput.state out)."""
        return self.initial_state is not None

    def params(self, **kwargs: Any) -> LossParams:
        """Construct and validate the params; unknown keys name the valid ones."""
        return _build_params(self.params_cls, kwargs, f"loss {self.name!r}", LossParamError)

    def parse_param(self, key: str, text: str) -> Any:
        """Convert a CLI string ``text`` to the type of parameter ``key``."""
        return _read_param(self.params_cls, key, text, f"loss {self.name!r}", LossParamError)


def coerce(info: ParamInfo, text: Any, where: str) -> Any:
    """``text`` (a CLI string or a YAML scalar) as the type of parameter ``info``; a LossParamError naming ``where``."""
    typ, optional = value_type(info.type)  # ``float | None``: read as a float, or ``none`` / ``null`` as None
    if isinstance(text, bool | int | float) and typ in (bool, int, float):
        text = str(text)  # a YAML 1 for a float, 2.0 for an int: read like the same text on the command line
    if not isinstance(text, str):
        return text
    if info.choices is not None and all(isinstance(c, str) for c in info.choices):
        return text
    if optional and text.strip().lower() in _NONE:
        return None
    try:
        return read_scalar(text, typ)
    except ValueError:
        name = typ.__name__ + (" or none" if optional else "")  # only bool, int and float raise, all classes
        raise LossParamError(f"{where}: cannot read {text!r} as {name}") from None


def _no_parameter(owner: str, keys: Iterable[str], valid: Iterable[str]) -> str:
    return (
        f"{owner} has no parameter {', '.join(repr(k) for k in keys)}; "
        f"valid parameters: {', '.join(sorted(valid)) or '(none)'}"
    )


def _build_params(
    cls: type[LossParams], kwargs: Mapping[str, Any], owner: str, error: type[LossParamError]
) -> LossParams:
    """``cls(**kwargs)`` for ``owner`` (``"loss 'dpo'"``, ``"modifier 'wpo'"``); an unknown key names the valid ones,
    and every failure is one ``error`` naming ``owner``."""
    valid = {i.name for i in param_infos(cls)}
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise error(_no_parameter(owner, unknown, valid))
    try:
        return cls(**kwargs)
    except LossParamError as e:
        raise error(f"{owner}: {e}") from None
    except (TypeError, ValueError) as e:
        raise error(f"{owner}: invalid parameters {kwargs!r}: {e}") from e


def _read_param(cls: type[LossParams], key: str, text: Any, owner: str, error: type[LossParamError]) -> Any:
    """``text`` (a CLI string or a YAML scalar) as the type of ``owner``'s parameter ``key``; an unknown ``key`` is
    one ``error`` naming the valid ones."""
    infos = {i.name: i for i in param_infos(cls)}
    if key not in infos:
        raise error(_no_parameter(owner, [key], infos))
    return coerce(infos[key], text, where=f"{owner}: parameter {key!r}")


class Loss:
    """A loss bound to validated params: ``out = loss(batch)`` or ``loss(batch, gather=fn)``.

    A stateful loss (``spec.initial_state``) is also bound to its state: ``loss.state`` goes in as ``ctx.state``
    and the returned ``LossOutput.state`` replaces it after each training call.  ``state_dict`` /
    ``load_state_dict`` make the loss checkpointable: a dict of tensors, which the trainer saves as safetensors
    (``prefzoo.train.checkpoint.save_loss_state``; never a pickle).
    """

    def __init__(self, spec: LossSpec, params: LossParams) -> None:
        self.spec = spec
        self.params = params
        self.state: LossState | None = None
        if spec.initial_state is not None:
            self.state = _detached(spec.initial_state(params))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def needs(self) -> frozenset[Need]:
        return self.spec.needs

    @property
    def batch_coupled(self) -> bool:
        return self.spec.is_batch_coupled(self.params)

    def __repr__(self) -> str:
        return f"Loss({self.spec.name!r}, {self.params!r})"

    def check_inputs(self, batch: AnyBatch) -> None:
        """The batch is of a shape this loss takes and carries every field it needs, else a one-line error."""
        shape = shape_of(batch)
        if shape is None or not self.spec.accepts(shape):
            want = " or ".join(_BATCH_NAMES[x] for x in sorted(self.spec.shapes, key=lambda x: x.value))
            hint = _SHAPE_HINT.get((shape, frozenset(self.spec.shapes)), "")
            raise PreferenceBatchError(f"loss {self.name!r} takes a prefzoo.{want}, got {type(batch).__name__}{hint}")
        if getattr(batch, "density_ratio_weights", None) is not None and not self.spec.density_ratio_weights:
            raise PreferenceBatchError(
                f"loss {self.name!r} does not use density-ratio weights (LossSpec.density_ratio_weights), but "
                "UnpairedBatch.density_ratio_weights is set: drop them (or --density-ratio)"
            )
        fields_of = NEED_FIELDS if isinstance(batch, PreferenceBatch) else type(batch).NEED_FIELDS
        kind = type(batch).__name__
        for need in self.needs:
            if need not in fields_of:
                raise PreferenceBatchError(f"loss {self.name!r} needs {need.value}, which a {kind} cannot carry")
            missing = [f for f in fields_of[need] if getattr(batch, f) is None]
            if missing:
                raise PreferenceBatchError(
                    f"loss {self.name!r} needs {need.value}: {kind}.{missing[0]} is None "
                    f"(required fields: {', '.join(fields_of[need])})"
                )

    def __call__(
        self, batch: AnyBatch, gather: Callable[[Tensor], Tensor] | None = None, update_state: bool | None = None
    ) -> LossOutput:
        """The loss on ``batch``; pairs given to a list-only loss run as K = 2 groups (one loss per pair).

        ``update_state``: whether a stateful loss advances its state; by default it does when autograd is on (a
        training step) and not under ``torch.no_grad()`` (evaluation), as TRL's ``do_train``.
        """
        self.check_inputs(batch)
        batch = upcast(batch)
        if isinstance(batch, PreferenceBatch) and Shape.PAIR not in self.spec.shapes:
            batch = group_from_pairs(batch)
        update = torch.is_grad_enabled() if update_state is None else update_state
        ctx = LossContext(state=self.state, update_state=update, **({} if gather is None else {"gather": gather}))
        out = self.spec.fn(batch, self.params, ctx)
        check_output(self.name, self.spec.plugin, out, batch)
        check_state(self.name, self.spec.plugin, out.state, self.state)
        if update and out.state is not None:
            self.state = _detached(out.state)
        return out

    def state_dict(self) -> LossState:
        """A copy of the state (empty for a stateless loss), for checkpoints."""
        return {k: v.detach().clone() for k, v in (self.state or {}).items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Restore a state saved by :meth:`state_dict`; a missing, unknown or mis-shaped entry is a ValueError."""
        if self.state is None:
            if state:
                raise ValueError(f"loss {self.name!r} has no state, but the checkpoint holds {sorted(state)}")
            return
        try:
            check_state(self.name, self.spec.plugin, dict(state), self.state)
        except LossOutputError as e:
            raise ValueError(f"cannot restore the state of loss {self.name!r}: {e}") from None
        self.state = {k: torch.as_tensor(v).to(self.state[k]) for k, v in state.items()}


_BATCH_NAMES = {Shape.PAIR: "PreferenceBatch", Shape.LIST: "GroupBatch", Shape.UNPAIRED: "UnpairedBatch"}
_SHAPE_HINT: dict[tuple[Shape | None, frozenset[Shape]], str] = {
    (Shape.LIST, PAIRS_ONLY): "; reduce the lists to pairs first: prefzoo.pairs_from_lists(batch, 'best-worst') "
    "or --pairs-from-lists",
}


def _detached(state: Mapping[str, Tensor]) -> LossState:
    return {k: v.detach() for k, v in state.items()}


def check_state(name: str, plugin: str, new: Any, old: LossState | None) -> None:
    """A stateful loss returns a state with its keys and shapes; a stateless one returns none."""
    who = f"loss {name!r} (plugin {plugin!r})"
    if old is None:
        if new is not None:
            raise LossOutputError(f"{who} returned a state but declares none: set LossSpec.initial_state")
        return
    if not isinstance(new, Mapping):
        raise LossOutputError(f"{who} returned no state (LossOutput.state); a stateful loss returns its next state")
    if set(new) != set(old):
        extra, missing = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        raise LossOutputError(f"{who} returned state keys {sorted(new)}: unknown {extra}, missing {missing}")
    for k, v in new.items():
        if not isinstance(v, Tensor) or v.shape != old[k].shape:
            got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise LossOutputError(f"{who} returned state {k!r} of shape {got}; expected {tuple(old[k].shape)}")


def upcast(batch: AnyBatch) -> AnyBatch:
    """Half-precision inputs are computed in float32 (autograd flows back through the cast)."""
    changes = {}
    for f in dataclasses.fields(batch):
        t = getattr(batch, f.name)
        if isinstance(t, Tensor) and t.dtype in (torch.bfloat16, torch.float16):
            changes[f.name] = t.float()
    return batch.replace(**changes) if changes else batch


def check_output(name: str, plugin: str, out: Any, batch: AnyBatch | int) -> None:
    """Enforce the LossOutput contract for the batch's shape, so a broken plugin is named, not a crash later.

    ``batch`` may be the batch size B alone (a pairwise loss's output).
    """
    who = f"loss {name!r} (plugin {plugin!r})"
    b = batch if isinstance(batch, int) else batch.batch_size
    per = "per pair" if isinstance(batch, int | PreferenceBatch) else (
        "per group" if isinstance(batch, GroupBatch) else "per completion")
    if not isinstance(out, LossOutput):
        raise LossOutputError(f"{who} returned {type(out).__name__}, expected prefzoo.LossOutput")
    for field_name in ("losses", "chosen_rewards", "rejected_rewards"):
        t = getattr(out, field_name)
        if not isinstance(t, Tensor) or tuple(t.shape) != (b,):
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise LossOutputError(f"{who} returned {field_name} of shape {shape}; expected ({b},), one {per}")
    if not isinstance(out.metrics, Mapping):
        raise LossOutputError(f"{who} returned metrics of type {type(out.metrics).__name__}; expected a dict")
    if out.rewards is not None and not isinstance(batch, int):
        want = (b, 2) if isinstance(batch, PreferenceBatch) else tuple(batch.policy_logps.shape)
        got = tuple(out.rewards.shape) if isinstance(out.rewards, Tensor) else type(out.rewards).__name__
        if got != want:
            raise LossOutputError(f"{who} returned rewards of shape {got}; expected {want}, one per completion")


# --- modifiers: a second kind of plugin, transforming what any compatible loss sees or returns -------------------


class ModifierError(LossParamError):
    """A modifier that does not apply to a loss, or a malformed modifier option; the message names both and why."""


InnerLoss = Callable[[PreferenceBatch, Any], LossOutput]  # (batch, loss params) -> the output of the loss it wraps
ModifierFn = Callable[[InnerLoss, PreferenceBatch, Any, "LossSpec", Any, LossContext], LossOutput]


@dataclass(frozen=True)
class Applicability:
    """Which losses a modifier applies to: a predicate over the loss's declared capabilities, and its words."""

    text: str  # e.g. "reward-difference losses with β (LossSpec.reward_difference)"
    test: Callable[[LossSpec, Any], bool]  # (loss spec, loss params) -> applies

    def __call__(self, spec: LossSpec, params: Any) -> bool:
        return bool(self.test(spec, params))


@dataclass(frozen=True)
class ModifierSpec:
    """Everything the registry, composition, trainer and docs know about one modifier.

    ``fn(inner, batch, params, loss_spec, loss_params, ctx) -> LossOutput`` wraps the loss: it may rewrite the batch
    or the loss params before calling ``inner(batch, loss_params)``, and reweight or mask the per-pair losses it
    returns.  It reads the loss only through its declared capabilities (``loss_spec``), never its name.
    """

    name: str  # the value of --modifier; lower-case words joined by '-'
    fn: ModifierFn
    params_cls: type[LossParams]  # frozen kw-only dataclass with param() fields, validated like a loss's
    paper: str  # citation with arXiv id
    applies: Applicability  # which losses it modifies
    needs: frozenset[Need] = frozenset()  # inputs the trainer must compute in addition to the loss's
    reference_needs: frozenset[Need] = frozenset()  # further inputs when the loss needs a reference
    batch_coupled: bool = False  # the modified loss of a pair depends on other pairs (through ctx.gather)
    preserves_monotone: bool = True  # a monotone loss stays monotone (weights ≥ 0, increasing transforms)
    preserves_shift_invariance: bool = True
    updates_reference: bool = False  # the reference model changes during training (no cache, no adapter-disabled)
    callback: str = ""  # the trainer callback it installs (a --callback name or 'module:Class'), given its params
    # stateful modifiers (β-DPO's running margin statistics): params -> the state before step one; fn then reads
    # ctx.state (its own keys) and returns its next state in LossOutput.state, as a stateful loss does
    initial_state: Callable[[Any], LossState] | None = None
    permutation_equivariant: bool | Callable[[Any], bool] = True  # per modifier params; False for a random draw
    trl: str = ""  # TRL 1.16's name for the same setting, if any
    description: str = ""
    notes: str = ""
    # what it changes, in LaTeX in the paper's symbols: the one source of the docs' typeset line and of
    # ``transforms`` (its plain-text reading, :func:`tex_to_text`), which `prefzoo modifiers NAME` prints
    transforms_tex: str = dataclasses.field(default="", kw_only=True)
    transforms: str = dataclasses.field(default="", kw_only=True)  # derived from transforms_tex when given
    plugin: str = "?"  # filled in by the registry
    builtin: bool = False  # filled in by the registry

    def __post_init__(self) -> None:
        if self.transforms_tex:
            object.__setattr__(self, "transforms", tex_to_text(self.transforms_tex))
        if not dataclasses.is_dataclass(self.params_cls) or not issubclass(self.params_cls, LossParams):
            raise TypeError(f"modifier {self.name!r}: params_cls must be a LossParams dataclass")
        if not callable(self.fn):
            raise TypeError(f"modifier {self.name!r}: fn is not callable")
        if not isinstance(self.applies, Applicability):
            raise TypeError(f"modifier {self.name!r}: applies must be a prefzoo.Applicability")
        for n in self.needs | self.reference_needs:
            if not isinstance(n, Need):
                raise TypeError(f"modifier {self.name!r}: needs must hold prefzoo.Need values, got {n!r}")

    def params(self, **kwargs: Any) -> LossParams:
        """Construct and validate the params; unknown keys name the valid ones."""
        return _build_params(self.params_cls, kwargs, f"modifier {self.name!r}", ModifierError)

    def parse_param(self, key: str, text: Any) -> Any:
        return _read_param(self.params_cls, key, text, f"modifier {self.name!r}", ModifierError)

    def why_not(self, loss: LossSpec, loss_params: Any) -> str | None:
        """None when this modifier applies to ``loss`` with ``loss_params``, else a one-line reason naming both."""
        if Shape.PAIR not in loss.shapes:
            shapes = ", ".join(sorted(s.value for s in loss.shapes))
            return (
                f"modifier {self.name!r} cannot modify loss {loss.name!r}: modifiers take pairs; {loss.name} takes "
                f"{shapes}"
            )
        if self.applies(loss, loss_params):
            return None
        applies = text_of(self.applies.text)
        return f"modifier {self.name!r} cannot modify loss {loss.name!r}: {self.name} applies to {applies}"
