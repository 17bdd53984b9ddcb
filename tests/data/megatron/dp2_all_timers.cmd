=== dp2_all_timers: --micro-batch-size 4 --global-batch-size 64 --log-interval 1 --timing-log-option all --use-distributed-optimizer
