"""BCO's underlying-distribution matching (UDM): a density-ratio weight for each undesirable example's prompt.

Jung et al. 2024 (arXiv:2404.04656, Sec. 3.3), as TRL's BCOTrainer (``embedding_func``, ``min_density_ratio``,
``max_density_ratio``, ``prompt_sample_size``): a logistic-regression classifier of "desirable vs undesirable prompt"
is fitted once on prompt embeddings, and an undesirable example's loss is weighted by the estimated density ratio
p(x | desirable) / p(x | undesirable) = P(desirable | x) / (1 − P(desirable | x)), clamped to
[min_density_ratio, max_density_ratio]; desirable examples keep weight 1.

The classifier is TRL's ``sklearn.linear_model.LogisticRegression(class_weight="balanced")`` (L2, C = 1, intercept
not penalized) written in torch (float64, L-BFGS): no sklearn at run time, and its two tensors go into checkpoints.
The prompt embedding is pluggable (:mod:`prefzoo.model.embedding` has the default: mean-pooled last hidden
states).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DensityRatioClassifier", "udm_weights"]

MIN_DENSITY_RATIO = 0.5  # TRL BCOConfig.min_density_ratio
MAX_DENSITY_RATIO = 10.0  # TRL BCOConfig.max_density_ratio


@dataclass(frozen=True)
class DensityRatioClassifier:
    """P(desirable | prompt embedding e) = σ(e·w + b)."""

    weight: Tensor  # (D,) float64
    bias: Tensor  # () float64

    @classmethod
    def fit(
        cls, desirable: Tensor, undesirable: Tensor, c: float = 1.0, max_iter: int = 1000
    ) -> DensityRatioClassifier:
        """Minimize C·Σ_i s_i·log(1 + e^(−y_i(e_i·w + b))) + ½‖w‖² over (w, b), s_i = n / (2·n_class(i)) ("balanced").

        ``desirable`` (n_D, D) and ``undesirable`` (n_U, D) prompt embeddings; a ValueError if either is empty.
        """
        if desirable.ndim != 2 or undesirable.ndim != 2 or desirable.shape[1] != undesirable.shape[1]:
            raise ValueError(f"embeddings must be (n, D) with one D, got {tuple(desirable.shape)} and "
                             f"{tuple(undesirable.shape)}")  # fmt: skip
        n_d, n_u = desirable.shape[0], undesirable.shape[0]
        if n_d == 0 or n_u == 0:
            raise ValueError(
                f"the density-ratio classifier needs desirable and undesirable prompts, got {n_d} and {n_u}"
            )
        x = torch.cat([desirable, undesirable]).detach().to(torch.float64).cpu()  # (n, D)
        y = torch.cat([torch.ones(n_d), torch.zeros(n_u)]).to(torch.float64)  # (n,)
        n = n_d + n_u
        # (n,) the balanced class weights in float64 (torch.tensor of a Python float would round them to float32)
        s = torch.where(y > 0, y.new_tensor(n / (2 * n_d)), y.new_tensor(n / (2 * n_u)))
        theta = torch.zeros(x.shape[1] + 1, dtype=torch.float64, requires_grad=True)  # (w, b)
        opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=max_iter, tolerance_grad=1e-12, tolerance_change=1e-16,
                                history_size=20, line_search_fn="strong_wolfe")  # fmt: skip

        def objective() -> Tensor:
            opt.zero_grad()
            z = x @ theta[:-1] + theta[-1]  # (n,)
            value = c * (s * F.binary_cross_entropy_with_logits(z, y, reduction="none")).sum()
            value = value + 0.5 * (theta[:-1] ** 2).sum()
            value.backward()
            return value

        opt.step(objective)
        w = theta.detach()
        return cls(w[:-1].clone(), w[-1].clone())

    def prob_desirable(self, embeddings: Tensor) -> Tensor:
        """(N,) P(desirable | e) for (N, D) embeddings, float64."""
        e = embeddings.detach().to(device=self.weight.device, dtype=torch.float64)
        return torch.sigmoid(e @ self.weight + self.bias)

    def state_dict(self) -> dict[str, Tensor]:
        return {"weight": self.weight.clone(), "bias": self.bias.clone()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Tensor]) -> DensityRatioClassifier:
        return cls(state["weight"].to(torch.float64), state["bias"].to(torch.float64))


def udm_weights(prob_desirable: Tensor, labels: Tensor, min_ratio: float = MIN_DENSITY_RATIO,
                max_ratio: float = MAX_DENSITY_RATIO) -> Tensor:  # fmt: skip
    """(N,) per-example weights: 1 for desirable examples, clamp(p / (1 − p + 1e-8), min, max) for undesirable ones.

    TRL's ``_get_udm_weight`` (the 1e-8 included), a constant.
    """
    p = prob_desirable.detach()  # (N,)
    ratio = (p / (1 - p + 1e-8)).clamp(min=min_ratio, max=max_ratio)
    return torch.where(labels.bool(), torch.ones_like(ratio), ratio)
