"""prefzoo-caldpo: the Cal-DPO loss as a prefzoo plugin."""

from prefzoo_caldpo.plugin import CalDPOParams, cal_dpo_loss

__all__ = ["CalDPOParams", "cal_dpo_loss"]
