"""The model kinds sense7 knows about, in one place: what `sense7 evaluate` cross-validates, in which
order, and how the report names and colours each one.

Adding a model kind is one call:

    from sense7.model.catalog import ModelKind, register

    register(ModelKind("my_model", MyRater, label="My model", color="#2a9d8f", role="rater"))

`MyRater()` must follow the estimator contract of DESIGN.md (sklearn-style `fit(X, Y)`, `predict(X)`,
`predict_proba(X)` -> {control: (n, levels)}, cloneable with `sklearn.base.clone`). From then on
`sense7.research.evaluation.default_models()` includes it, the HTML report labels and colours it, and
`sense7 evaluate --models my_model` / `--list-models` know it. `unregister(name)` (or the
`registered(kind)` context manager) takes it out again; functions that read the catalog also accept a
`Catalog` of their own instead of the shared `CATALOG`.

Roles: "baseline" (trivial reference models, drawn in greys) and "rater" (real rater models: the report
draws their confusion matrices). This is about *kinds* of model; `sense7.model.registry` is the on-disk
registry of trained model *versions*, a different thing.

The served ModelBundle (sense7.model.bundle) keeps its two fixed fields, `generic` and `personalized`: they
are the pickled serving contract the ML backend and existing bundles on disk rely on (see the note there).
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

ROLES = ("baseline", "rater")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class UnknownModelError(ValueError):
    """A model name that is not in the catalog; the message lists the catalog's names."""


@dataclass(frozen=True)
class ModelKind:
    name: str  # what --models and the JSON result use: lower case, digits, underscores
    factory: Callable[[], Any]  # returns a fresh, unfitted sklearn-style estimator
    label: str = ""  # for reports (default: the name)
    color: str | None = None  # a matplotlib colour for plots (None: matplotlib's next colour)
    role: str = "rater"  # "baseline" or "rater"
    description: str = ""  # one line for `sense7 evaluate --list-models`

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"model kind name {self.name!r}: use lower case letters, digits and underscores, "
                             "starting with a letter")
        if not callable(self.factory):
            raise ValueError(f"model kind {self.name!r}: factory must be callable (it returns a fresh estimator)")
        if self.role not in ROLES:
            raise ValueError(f"model kind {self.name!r}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if not self.label:
            object.__setattr__(self, "label", self.name)


class Catalog:
    """An ordered set of ModelKinds (the order is the report's and the evaluation's order)."""

    def __init__(self, kinds: Iterable[ModelKind] = ()):
        self._kinds: dict[str, ModelKind] = {}
        for kind in kinds:
            self.register(kind)

    # -- changing it ---------------------------------------------------------------------------------
    def register(self, kind: ModelKind, replace: bool = False) -> ModelKind:
        """Add `kind` at the end (or, with replace=True, swap an entry of the same name in place)."""
        if not isinstance(kind, ModelKind):
            raise TypeError(f"register() takes a ModelKind, not a {type(kind).__name__}")
        if kind.name in self._kinds and not replace:
            raise ValueError(f"model kind {kind.name!r} is already registered (pass replace=True to swap it)")
        self._kinds[kind.name] = kind
        return kind

    def unregister(self, name: str) -> ModelKind:
        return self._kinds.pop(self.get(name).name)

    @contextlib.contextmanager
    def registered(self, kind: ModelKind) -> Iterator[ModelKind]:
        """Register `kind` for the duration of a with block (tests, notebooks)."""
        self.register(kind)
        try:
            yield kind
        finally:
            self._kinds.pop(kind.name, None)

    def copy(self) -> "Catalog":
        return Catalog(self._kinds.values())

    # -- reading it ----------------------------------------------------------------------------------
    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def get(self, name: str) -> ModelKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownModelError(f"unknown model {name!r}; choose from {', '.join(self._kinds)}") from None

    def check(self, names: Iterable[str]) -> list[str]:
        """`names` as a list; UnknownModelError naming every unknown one and the known ones."""
        names = list(names)
        unknown = [n for n in names if n not in self._kinds]
        if not names:
            raise UnknownModelError(f"no model chosen; choose from {', '.join(self._kinds)}")
        if unknown:
            raise UnknownModelError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(self._kinds)}")
        return names

    def make(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """Fresh estimators {name: estimator} for `names` (default: all), in catalog order."""
        chosen = set(self.check(names)) if names is not None else set(self._kinds)
        return {name: kind.factory() for name, kind in self._kinds.items() if name in chosen}

    def order(self, names: Iterable[str]) -> list[str]:
        """`names` in catalog order; names the catalog does not know keep their order, at the end."""
        names = list(names)
        return [n for n in self._kinds if n in names] + [n for n in names if n not in self._kinds]

    def label(self, name: str) -> str:
        return self._kinds[name].label if name in self._kinds else name

    def color(self, name: str) -> str | None:
        return self._kinds[name].color if name in self._kinds else None

    def role(self, name: str) -> str | None:
        return self._kinds[name].role if name in self._kinds else None

    def __iter__(self) -> Iterator[ModelKind]:
        return iter(list(self._kinds.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __len__(self) -> int:
        return len(self._kinds)


# Factories import lazily: reading the catalog (e.g. for `sense7 --help`) must not load the estimators.
@dataclass(frozen=True)
class LazyFactory:
    """A factory of `module.name()`, imported on the first call (picklable, and equal by what it builds)."""

    module: str
    name: str

    def __call__(self):
        return getattr(importlib.import_module(self.module), self.name)()


# The packaged kinds: (name, module, class, label, colour, role, description).
PACKAGED = (
    ("majority", "baselines", "MajorityClass", "Majority class", "#bbbbbb", "baseline",
     "the most frequent training level of each control"),
    ("global_mean", "baselines", "GlobalMean", "Global mean", "#999999", "baseline", "the training mean of each control"),
    ("rater_mean", "baselines", "RaterMean", "Rater mean", "#6f6f6f", "baseline",
     "the rater's own training mean (shrunk to the global mean)"),
    ("rater_median", "baselines", "RaterMedian", "Rater median", "#8a8a8a", "baseline",
     "the rater's own median training level (all mass on it)"),
    ("generic", "estimators", "GenericRater", "Generic", "#4a7bd0", "rater", "text only: the same prediction for every rater"),
    ("personalized", "estimators", "PersonalizedRater", "Personalized", "#d0734a", "rater",
     "text plus the rater's traits and past ratings"),
)
CATALOG = Catalog([ModelKind(name, LazyFactory(f"sense7.model.{module}", cls), label, color, role, text)
                   for name, module, cls, label, color, role, text in PACKAGED])

register = CATALOG.register
unregister = CATALOG.unregister
registered = CATALOG.registered
