"""Preference data: loading and normalizing formats, tokenization with truncation, and collation.

Heavy imports (datasets, transformers) happen inside the functions, so importing this package is cheap.
"""

from prefzoo.data.collate import PreferenceCollator
from prefzoo.data.formats import FORMATS, DataFormatError, detect_format, load_preference_dataset, normalize
from prefzoo.data.tokenize import TokenizeStats, ensure_pad_token, render_prompt, tokenize_pairs

__all__ = [
    "FORMATS",
    "DataFormatError",
    "PreferenceCollator",
    "TokenizeStats",
    "detect_format",
    "ensure_pad_token",
    "load_preference_dataset",
    "normalize",
    "render_prompt",
    "tokenize_pairs",
]
