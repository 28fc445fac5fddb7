"""Scoring batches with a loss, below the trainer, evaluation and the integrations (each of the three stands on it).

A collated batch as the loss's fields (:func:`batch_fields`, :func:`preference_batch`), held-out batches scored
(:func:`score_batches`, :func:`correct_rows`), the reference variants (:func:`build_reference`; the precomputed
table and its cache: :func:`precompute_reference`), and the rank-ordered gather a batch-coupled loss reads
(:func:`make_gather`).  Other packages import these names from here, not from the modules.
"""

from __future__ import annotations

from prefzoo.scoring.fields import batch_fields, batch_type, float_fields, preference_batch, row_ids
from prefzoo.scoring.gather import make_gather
from prefzoo.scoring.reference import (
    AdapterDisabledReference,
    FrozenReference,
    PrecomputedReference,
    Reference,
    build_reference,
)
from prefzoo.scoring.reference_cache import (
    load_or_compute_reference_table,
    model_identity,
    precompute_reference,
    read_safetensors,
)
from prefzoo.scoring.scores import correct_rows, score_batches

__all__ = [
    "AdapterDisabledReference",
    "FrozenReference",
    "PrecomputedReference",
    "Reference",
    "batch_fields",
    "batch_type",
    "build_reference",
    "correct_rows",
    "float_fields",
    "load_or_compute_reference_table",
    "make_gather",
    "model_identity",
    "precompute_reference",
    "preference_batch",
    "read_safetensors",
    "row_ids",
    "score_batches",
]
