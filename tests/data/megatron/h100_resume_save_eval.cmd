=== resume: --save /tmp/gp/ckpt-resume --train-iters 40 --exit-interval 20
=== resume: --save /tmp/gp/ckpt-resume --load /tmp/gp/ckpt-resume --train-iters 40
