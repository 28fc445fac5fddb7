"""Any prefzoo loss inside TRL's ``DPOTrainer`` and ``KTOTrainer``, with one changed import.

    from trl import DPOConfig
    from prefzoo.integrations.trl import DPOTrainer      # was: from trl import DPOTrainer
    trainer = DPOTrainer(model, args=DPOConfig(...), train_dataset=ds, processing_class=tok, loss="mmpo")

    from prefzoo.integrations.trl import KTOTrainer      # was: from trl import KTOTrainer
    trainer = KTOTrainer(model, args=KTOConfig(...), train_dataset=ds, processing_class=tok, loss="bco")

Everything but the loss stays TRL's (:mod:`.dpo`, :mod:`.kto`); the pieces both share are in :mod:`._common`.
TRL's internals change between releases, so the supported range is checked at import (:data:`TRL_RANGE`).
"""

from __future__ import annotations

from prefzoo.errors import install_hint
from prefzoo.integrations.trl._version import TRL_RANGE, TRLVersionError, check_trl_version

try:
    import trl
except ImportError:
    raise ImportError(f"prefzoo.integrations.trl needs TRL: {install_hint('trl')}") from None
check_trl_version(trl.__version__)  # here, so that every fresh import of the package checks

from prefzoo.integrations.trl._common import PolicyDivergedError, check_policy_finite  # noqa: E402
from prefzoo.integrations.trl.dpo import CONFIG_MODIFIERS, CONFIG_PARAMS, DPOTrainer, resolve_loss  # noqa: E402
from prefzoo.integrations.trl.kto import KTO_CONFIG_PARAMS, KTOTrainer, resolve_unpaired_loss  # noqa: E402

__all__ = [
    "CONFIG_MODIFIERS",
    "CONFIG_PARAMS",
    "KTO_CONFIG_PARAMS",
    "TRL_RANGE",
    "DPOTrainer",
    "KTOTrainer",
    "PolicyDivergedError",
    "TRLVersionError",
    "check_policy_finite",
    "check_trl_version",
    "resolve_loss",
    "resolve_unpaired_loss",
]
