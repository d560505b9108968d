"""The mixture-of-experts options of :class:`epochal.model.config.ModelConfig` and their checks.

Names and meanings are Megatron-Core's (``TransformerConfig`` / the ``--moe-*`` flags):

=======================================  ==========================================
option                                   Megatron-LM flag
=======================================  ==========================================
``num_experts``                          ``--num-experts``
``moe_router_topk``                      ``--moe-router-topk``
``moe_ffn_hidden_size``                  ``--moe-ffn-hidden-size``
``moe_shared_expert_intermediate_size``  ``--moe-shared-expert-intermediate-size``
``moe_shared_expert_gate``               ``--moe-shared-expert-gate``
``moe_router_pre_softmax``               ``--moe-router-pre-softmax``
``moe_aux_loss_coeff``                   ``--moe-aux-loss-coeff``
``moe_z_loss_coeff``                     ``--moe-z-loss-coeff``
``moe_expert_capacity_factor``           ``--moe-expert-capacity-factor``
``moe_layer_freq``                       ``--moe-layer-freq``
``moe_router_score_function``            ``--moe-router-score-function``
``moe_router_enable_expert_bias``        ``--moe-router-enable-expert-bias``
``moe_router_bias_update_rate``          ``--moe-router-bias-update-rate``
``moe_router_num_groups``                ``--moe-router-num-groups``
``moe_router_group_topk``                ``--moe-router-group-topk``
``moe_router_topk_scaling_factor``       ``--moe-router-topk-scaling-factor``
``moe_router_load_balancing_type``       ``--moe-router-load-balancing-type``
``moe_grouped_gemm``                     ``--moe-grouped-gemm``
=======================================  ==========================================
"""

from __future__ import annotations

from typing import Any, Literal

from epochal._checks import check_fields, is_int, require

__all__ = [
    "BalanceLoss",
    "MOE_FIELDS",
    "RouterScore",
    "is_moe_layer",
    "moe_layer_pattern",
    "validate_moe",
]

#: the router's score functions (Megatron-Core's ``--moe-router-score-function``)
RouterScore = Literal["softmax", "sigmoid"]
#: the balancing losses (Megatron-Core's ``--moe-router-load-balancing-type``)
BalanceLoss = Literal["aux_loss", "seq_aux_loss", "none"]

#: The MoE fields; :meth:`ModelConfig.to_dict` omits them when ``num_experts`` is None (dense).
MOE_FIELDS = (
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_gate",
    "moe_router_pre_softmax",
    "moe_aux_loss_coeff",
    "moe_z_loss_coeff",
    "moe_expert_capacity_factor",
    "moe_layer_freq",
    "moe_router_score_function",
    "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_topk_scaling_factor",
    "moe_router_load_balancing_type",
    "moe_grouped_gemm",
)


def moe_layer_pattern(freq: int | list[int], num_layers: int) -> list[bool]:
    """Which blocks have an MoE MLP (Megatron's ``moe_layer_freq``).

    An integer ``k`` makes blocks ``0, k, 2k, ...`` MoE blocks (Megatron's
    ``[1 if i % k == 0 else 0 for i in range(num_layers)]``); a list of 0/1 of
    length ``num_layers`` names each block (1 = MoE).
    """
    if isinstance(freq, list | tuple):
        return [bool(v) for v in freq]
    return [i % int(freq) == 0 for i in range(num_layers)]


def is_moe_layer(config: Any, layer_id: int) -> bool:
    """Whether GPT block ``layer_id`` of ``config`` has an MoE MLP (False for a dense model)."""
    if config.num_experts is None:
        return False
    return moe_layer_pattern(config.moe_layer_freq, config.num_layers)[layer_id]


def validate_moe(self: Any) -> None:
    """The rules of the MoE fields of ``ModelConfig`` ``self`` (their ``"moe"`` group with experts).

    Raises:
        ConfigError: the first field that breaks one, named.
    """
    n = self.num_experts
    if n is None:
        for name in (
            "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size",
            "moe_expert_capacity_factor",
            "moe_router_num_groups",
            "moe_router_group_topk",
            "moe_router_topk_scaling_factor",
        ):
            require(
                getattr(self, name) is None,
                name,
                "is a mixture-of-experts option: set num_experts too, or leave it at None",
            )
        return
    check_fields(self, "moe")
    require(
        self.type == "gpt",
        "num_experts",
        f"mixture-of-experts layers are built for model.type='gpt' only, got {self.type!r}",
    )
    k = self.moe_router_topk
    require(
        is_int(k) and 1 <= k <= n,
        "moe_router_topk",
        f"must be an integer in [1, num_experts={n}], got {k!r}",
    )
    require(
        not self.moe_shared_expert_gate or self.moe_shared_expert_intermediate_size is not None,
        "moe_shared_expert_gate",
        "gates the shared expert: set moe_shared_expert_intermediate_size too",
    )
    freq = self.moe_layer_freq
    if isinstance(freq, list | tuple):
        require(
            len(freq) == self.num_layers and all(v in (0, 1) for v in freq) and any(freq),
            "moe_layer_freq",
            f"as a list must give 0 (dense) or 1 (MoE) for each of the num_layers={self.num_layers} "
            f"blocks, at least one 1; got {list(freq)!r}",
        )
    else:
        require(
            is_int(freq) and 1 <= freq,
            "moe_layer_freq",
            f"must be an integer >= 1 (every k-th block, block 0 first) or a list of 0/1 per "
            f"block, got {freq!r}",
        )
    _validate_router(self)
    require(
        not (self.moe_grouped_gemm and self.add_bias_linear),
        "moe_grouped_gemm",
        "the grouped expert products take no linear biases (as Megatron-Core's GroupedMLP): "
        "set add_bias_linear=false or moe_grouped_gemm=false",
    )
    require(
        self.lora_rank == 0,
        "lora_rank",
        "LoRA adapters are not supported on mixture-of-experts models (num_experts is set)",
    )


def _validate_router(self: Any) -> None:
    """The score function, expert bias and group-limited routing (Megatron-Core's rules)."""
    n, k = self.num_experts, self.moe_router_topk
    require(
        not self.moe_router_enable_expert_bias or self.moe_router_score_function == "sigmoid",
        "moe_router_enable_expert_bias",
        "balances sigmoid scores (DeepSeek-V3): set moe_router_score_function='sigmoid'",
    )
    require(
        not (self.moe_router_pre_softmax and self.moe_router_score_function == "sigmoid"),
        "moe_router_pre_softmax",
        "is a softmax option; sigmoid scores are renormalised over the top-k when "
        "moe_router_topk > 1",
    )
    groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
    require(
        (groups is None) == (group_topk is None),
        "moe_router_group_topk" if groups is not None else "moe_router_num_groups",
        "group-limited routing needs both moe_router_num_groups and moe_router_group_topk",
    )
    if groups is None:
        return
    require(
        n % groups == 0,
        "moe_router_num_groups",
        f"must divide num_experts={n} into equal groups, got {groups}",
    )
    require(
        group_topk <= groups,
        "moe_router_group_topk",
        f"chooses among moe_router_num_groups={groups} groups, got {group_topk}",
    )
    require(
        group_topk <= k and k <= group_topk * (n // groups),
        "moe_router_group_topk",
        f"each chosen group scores its top moe_router_topk / group_topk experts and the "
        f"top-{k} come from {group_topk} groups of {n // groups}: need group_topk <= "
        f"moe_router_topk <= group_topk * {n // groups}, got group_topk={group_topk}",
    )
