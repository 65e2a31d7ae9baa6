"""Machine models (H100, H200, B200) and the tile-op cost model."""

from twill.machine.costs import (DTYPE_BYTES, OpCost, alu_cost, exp2_cost, mma_cost, reduce_cost,
                                 regs_per_thread, smem_cost, tma_load_cost, tma_reduce_cost, tma_store_cost,
                                 tmem_cost)
from twill.machine.models import B200, H100, H200, MACHINES, UNIT_DOC, Machine, get_machine

__all__ = ["B200", "DTYPE_BYTES", "H100", "H200", "MACHINES", "Machine", "OpCost", "UNIT_DOC", "alu_cost",
           "exp2_cost", "get_machine", "mma_cost", "reduce_cost", "regs_per_thread", "smem_cost",
           "tma_load_cost", "tma_reduce_cost", "tma_store_cost", "tmem_cost"]
