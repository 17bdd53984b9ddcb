=== tp2_mha_gelu: --tensor-model-parallel-size 2 --micro-batch-size 4 --global-batch-size 32 --log-interval 1 --timing-log-option max
