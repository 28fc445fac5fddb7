"""The exact speed paths of the log-prob engine, each tested equal to the plain forward, and the automatic choice.

- :mod:`~prefzoo.model.fast.head`: the LM head and float32 log-softmax on completion positions only, in chunks that
  keep no (positions × vocab) tensor alive for backward;
- :mod:`~prefzoo.model.fast.prompt`: one forward per pair over [x, y_w, y_l], the prompt processed once;
- :mod:`~prefzoo.model.fast.split`: that shared-prompt attention as two causal SDPA calls;
- :mod:`~prefzoo.model.fast.packing`: padding-free packing of a micro-batch's sequences into fewer rows;
- :mod:`~prefzoo.model.fast.fused_mlp`: gated-SiLU MLPs and RMS norms that keep fewer activations for backward;
- :mod:`~prefzoo.model.fast.sparse_dropout`: dropout that draws only the dropped positions;
- :mod:`~prefzoo.model.fast.choice`: which of prompt sharing, packing and length grouping a run uses (auto | on | off).


Other packages use them through :mod:`prefzoo.model`; this package's ``__init__`` imports nothing.
"""
