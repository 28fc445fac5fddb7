"""Built-in loss modifiers (WPO, LD-DPO, β-DPO, AlphaPO, ODPO, TR-DPO) and their composition with a loss."""
