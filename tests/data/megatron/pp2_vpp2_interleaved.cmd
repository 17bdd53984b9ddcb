=== pp2_vpp2_interleaved: --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 4 --global-batch-size 64 --log-interval 2
