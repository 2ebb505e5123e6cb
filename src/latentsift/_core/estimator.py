"""scikit-learn's estimator contract for the classes that claim it (``Bank``, ``LinearScorer``, the keep
rules, ``Sifter``): ``get_params(deep=True)`` and ``set_params(**params)`` read and write the constructor's
arguments, stored under their own names, so ``sklearn.base.clone(est)`` gives an unfitted copy with the same
settings, and model selection (``GridSearchCV``, nested ``bank__layer``) can use them as they are.

Hand-written after ``sklearn.base.BaseEstimator`` (its ``get_params``/``set_params``, without its HTML repr
and tags): importing ``sklearn.base`` imports scipy, a second of CPU at the start of every command that
imports a bank; scikit-learn itself is imported only where its models run (isotonic calibration, the probe).
"""
from __future__ import annotations

import inspect
from typing import Any

from .errors import LatentSiftError


class Estimator:
    """The estimator contract: the constructor only stores its arguments, each under its own name."""

    @classmethod
    def _param_names(cls) -> list[str]:
        """The constructor's named arguments, in signature order."""
        init = cls.__init__
        if init is object.__init__:
            return []
        return [p.name for p in inspect.signature(init).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments as stored; with ``deep``, also those of each argument that is an
        estimator itself, as ``name__param``."""
        out: dict[str, Any] = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params(deep=True).items())
            out[name] = value
        return out

    def set_params(self, **params: Any) -> "Estimator":
        """Set constructor arguments (``name`` or a nested ``name__param``); returns self."""
        valid = self.get_params(deep=True)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            name, nest, sub = key.partition("__")
            if name not in valid:
                raise LatentSiftError(f"The '{name}' parameter of {type(self).__name__}.set_params is not one of "
                                      f"its parameters ({', '.join(self._param_names())}).")
            if nest:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub in nested.items():
            valid[name].set_params(**sub)
        return self
