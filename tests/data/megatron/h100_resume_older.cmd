=== resume_older: --save /tmp/gp/ckpt-resume_older --train-iters 40 --exit-interval 20
=== resume_older: --save /tmp/gp/ckpt-resume_older --load /tmp/gp/ckpt-resume_older --train-iters 40
