"""The ``cct`` command's usage text: its commands, their flags, and the tools. Printed by
cct/cli.py (``cct`` alone, ``cct help``) and read by cct/flags.py for each command's summary in
its ``-help``; a module of its own so that neither imports the other.
"""

USAGE = """usage: cct <command> <args>

commands:
  train           train or finetune a model (-solver, -weights, -snapshot, -level, -stage,
                  -sigint_effect, -sighup_effect, -gpu, -devices: e.g. cpu:1,cpu:1 or cpu,gpu0
                  to split every batch across devices, -deterministic: fixed kernel plans,
                  none timed, so runs repeat to the bit whatever the machine's load;
                  -precision=float32|bf16|tf32|fp16: bf16 GEMMs where the CPU has bf16
                  units; on a GPU tensor-core GEMMs and convolutions in any of the three;
                  -cuda-graphs=on|off: a GPU iteration replayed as a CUDA graph (on);
                  -progress=auto|bar|none: a live progress line, by default on a terminal;
                  -strategy=sync|async|hogbatch|adaptive-hogbatch|sma -groups=G
                  -engine=threads|processes|simulated|ray
                  -staleness=round-robin|exponential
                  -momentum=auto|X -allow-negative-momentum -sync-fc -batch-sizes=16,256
                  -threshold=T -learners=K|auto -sma-alpha=A -sma-momentum=M
                  -sync-period=P -simulate-speeds=1,8 -engine=ray -ray-address=A|auto
                  -ps-shards=N|auto -ray-group-restarts=R -ray-data=ship|local
                  -group-timeout=S: the driver's strategies, cct/driver; -optimize
                  -target-accuracy=A
                  -target-loss=L -budget=S -probe-share=P -retune-every=K: the optimizer
                  chooses them, cct/optimizer; -plot=PATH: a PNG of its plan's probes)
  plan            the optimizer's plan for a solver, without training (-solver, -devices,
                  -engine, -target-accuracy, -target-loss, -budget, -probe-share,
                  -bandwidth: each candidate's measured HE, probe, loss slope and predicted
                  time with its range, the choice and why, and the advisor's batch, devices
                  and shards; -plot=PATH: a PNG of the probes' loss curves;
                  -cluster=nodes=N,bandwidth=X[,shards=S][,overhead=C] -staleness=...:
                  the plan for that cluster, HE from the scale-out model, SE simulated)
  test            score a model (-model, -weights, -iterations, -level, -stage, -gpu,
                  -devices: one device, e.g. gpu1 or standin)
  time            benchmark forward/backward of a model (-model, -iterations, -phase, -level,
                  -stage, -precision=float32|bf16|tf32|fp16, -gpu, -devices: one device)
  device_query    show the devices cct can run on (-gpu)

tools (Caffe's tools/ and tools/extra/; each takes Caffe's own arguments and flags):
  convert_mnist_data        IMAGES LABELS DB [--backend=lmdb]
  convert_imageset          [--gray] [--shuffle] [--resize_height=H] [--resize_width=W]
                            [--check_size] [--encoded] [--encode_type=png] ROOTFOLDER/ LISTFILE DB
  compute_image_mean        [--backend=lmdb] DB [OUT.binaryproto]
  extract_features          WEIGHTS MODEL BLOB[,BLOB..] DB[,DB..] NUM_MINI_BATCHES [lmdb]
  upgrade_net_proto_text    IN.prototxt OUT.prototxt
  upgrade_solver_proto_text IN.prototxt OUT.prototxt
  parse_log                 LOGFILE OUTPUT_DIR [--delimiter ,] [--verbose]
  plot_log                  LOGFILE OUT.png [--follow [--follow-timeout=S]]
                            (or Caffe's: CHART_TYPE OUT.png LOGFILE...)
  summarize                 NET.prototxt [--phase TRAIN|TEST|ALL] [--max-width 30]
  draw_net                  NET.prototxt OUT.png [--rankdir LR|TB|BT|RL] [--phase TRAIN|TEST|ALL]
  export_onnx               --model=deploy.prototxt [--weights=w.caffemodel] --output=m.onnx
                            [--opset 13] [--batch dynamic|N] [--check]

Flags take any gflags spelling: -model x, -model=x, --model=x, --model x.
cct <command> --help lists a command's flags and defaults; cct --version prints the version."""
