"""Every cap perfd puts on what arrives from the network, declared once (docs/reliability.md).

Pure data, like the catalog: the transport, the aggregator, the agent and the docs read it; flags
override a few of them (``perfd aggregator --help``). Each refusal a cap causes is counted in
``perfd_aggregator_refused_total{reason}`` with one of the ``REFUSED_*`` reasons below, and logged
at most once per reason every ``REFUSAL_LOG_INTERVAL_S``.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- listening ------------------------------------------------------------------------------------
LOOPBACK = "127.0.0.1"  # where every daemon listens unless given an address (or --listen-all)
ALL_INTERFACES = "0.0.0.0"
# The agent's /metrics port unless given (--metrics-port, metrics_port:). Not 9400: that is
# dcgm-exporter's default, and dcgm-exporter runs on the same GPU nodes (AKS's managed one listens
# on 19400). The Prometheus wiki's "Default port allocations" range, 9100-9999, is fully allocated
# (each port there is some exporter's), so this one is outside it, below Kubernetes' NodePort range
# (30000-32767) and the kernel's ephemeral ports (32768-60999). Deploy files, the Dockerfile and the
# docs repeat the number; tests/deploy/test_agent_port.py keeps them equal to this.
AGENT_METRICS_PORT = 14400

# ---- transport (gRPC) -----------------------------------------------------------------------------
# One gRPC message, both directions. The agent keeps its batches below it (MAX_BATCH_BYTES).
MAX_MESSAGE_BYTES = 16 << 20
MAX_BATCH_BYTES = MAX_MESSAGE_BYTES - (64 << 10)  # room for the frame around a spooled batch
MAX_STREAMS = 10_000  # open ingest streams, all agents together
STREAMS_PER_AGENT = 1  # a newer stream of the same agent (same identity) closes the older one
HELLO_TIMEOUT_S = 10.0  # a stream that has not said Hello by then is closed
# Batches an agent has on a stream unacknowledged (its window: it writes that many after its Hello
# before it waits for an Ack).
AGENT_WINDOW = 16
# An unauthenticated stream is ended once the agent has stopped writing on it: its first message
# (the Hello) within REFUSAL_DRAIN_S, then what follows it at once (the window of batches a reconnect
# resends) until REFUSAL_QUIET_S pass without one, all within REFUSAL_DRAIN_S and at most a Hello and
# a window (read and dropped). Ended under a write, the agent's call finishes "INTERNAL" instead of
# "UNAUTHENTICATED" and it never learns why (1 stream end in 10 on a loaded 2-core machine when
# only the Hello was drained).
REFUSAL_DRAIN_S = 1.0
REFUSAL_QUIET_S = 0.2
REFUSAL_DRAIN_MESSAGES = 1 + AGENT_WINDOW
MAX_SERIES_PER_AGENT = 50_000  # series definitions one agent may hold at the aggregator
MAX_EVENT_BYTES = 256 << 10  # one event on the wire (text + labels + payload)
# What the aggregator keeps of one history event (in its event log, its journal and its documents):
# its text and payload within this many bytes, the rest cut and counted (reason event_cut). Kinds
# whose payload another part reads whole (perfd.core.events: EventKind.whole) are journalled whole, and
# only the event log's copy is cut. 2,400 events of 250 KB once grew the state file by 390 MB.
MAX_KEPT_EVENT_BYTES = 16 << 10
MAX_EVENT_LOG_BYTES = 16 << 20  # the event log (/api/events, the events document), all events together
# The event log's room (its count and its bytes) is divided into this many shares: a job's events (those
# the aggregator attributes to it) hold at most one share, and a sender's job-less events another, apart
# (perfd.aggregator.eventlog). One client's 1,250 job-less events once evicted all 20 of a job's; ten
# shares still leave a job 100 events of its own history.
EVENT_LOG_SHARES = 10
# Events kept whole for a consumer that reads their payload (a job's NCCL hang events, merged by the
# collective analysis): at most this many bytes of them per job, the oldest going first. 2,000 hang
# events of 250 KB once took the aggregator's RSS from 66 to 547 MB.
MAX_WHOLE_EVENT_BYTES_PER_JOB = 4 << 20

# Liveness (measured in tests/faults: a half-open link is noticed within LIVENESS_BUDGET_S).
KEEPALIVE_TIME_S = 10.0  # gRPC HTTP/2 ping interval, both sides
KEEPALIVE_TIMEOUT_S = 10.0  # a ping unanswered this long ends the connection
HEARTBEAT_S = 5.0  # the agent sends a Heartbeat after this long without writing
ACK_TIMEOUT_S = 20.0  # the agent drops a stream without any acknowledgement for this long
# The aggregator acknowledges a stream's batches at most this often (a Heartbeat at once): well
# inside ACK_TIMEOUT_S, and an agent sending a batch every 0.5 s fills 10 of its window of 16
# meanwhile. An Ack costs a grpc.aio server ~100 us (benchmarks/grpc_loop_bench.py: 1,000 streams,
# 0.151 core with an Ack every 2 s, 0.119 every 5 s), ~0.06 core of 2,000 agents at 2 s.
ACK_INTERVAL_S = 5.0
AGENT_SILENCE_S = 20.0  # the aggregator drops a stream that sent nothing for this long
# New streams are refused (UNAVAILABLE; the agent backs off and comes back) while the aggregator's
# event loop runs this late: accepting them would only delay every open stream's Acks towards
# ACK_TIMEOUT_S, and agents that time out reconnect, send their Hello again and add to the load (at
# 2,000 agents connecting at once on 2 cores that storm fed itself: 4,400 streams opened in 2 min).
MAX_LOOP_LAG_S = ACK_TIMEOUT_S / 4
# ... and while the aggregator cannot answer the streams it took before their agents give up on them
# (ACK_TIMEOUT_S): streams wait MAX_FIRST_ACK_WAIT_S for their first Ack, or more of them wait than it
# answers in half that at the rate it answers now (at least MAX_OPENING_STREAMS: a Hello of 200 series
# costs ~2.6 ms, 512 of them ~1.3 s of work). The event loop's lag alone never said no: 4,500 agents
# connecting at once left it under 5 s late while Hellos queued, 1,259 connected, p50 34 s, 0
# refusals.
MAX_FIRST_ACK_WAIT_S = ACK_TIMEOUT_S / 2
MAX_OPENING_STREAMS = 512
# ... or while the event loop's thread has been on a CPU, or waiting for one, this share of the time for
# MAX_LOOP_BUSY_S on end. New streams queue inside gRPC until the loop takes them, where the server
# cannot count them: a loop with no time left for as long as an agent waits for its first Ack is the
# sign it has (a shorter burst is absorbed: 2,000 agents at once on 2 cores all connected within 18 s).
# The refused are told to come back after as long as it has lasted (to 30 s), so that a lasting overload
# is spread further out.
MAX_LOOP_BUSY = 0.9
MAX_LOOP_BUSY_S = MAX_FIRST_ACK_WAIT_S
# A refused stream is told when to come back (gRPC metadata RETRY_AFTER_KEY, milliseconds, initial and
# trailing): the agent waits that long at least, times a jitter of 0.5-1.5 (perfd.transport.client), so
# that the refused spread out instead of coming back together.
RETRY_AFTER_KEY = "perfd-retry-after-ms"
MIN_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 30.0
LIVENESS_BUDGET_S = 30.0  # what docs/reliability.md promises

# ---- aggregator state -----------------------------------------------------------------------------
# What the caps count is what is held *now* (perfd.aggregator.retention): a job while a live stream's
# Hello names it or while its data is kept; a series while its agent is connected or recently was.
MAX_JOBS = 1_000  # distinct job names held
# Jobs one agent id may hold, and one identity (a client certificate, or the address of a client
# without credentials; the shared bearer token names every agent alike, so it has no quota of its
# own): one client cannot take the whole cap (a Hello naming 1,000 jobs took it, for good).
MAX_JOBS_PER_AGENT = 100
MAX_JOBS_PER_IDENTITY = 500
# An ended job (perfd.analytics.steps.liveness) is kept this long for its report and API, then pruned; a
# new job arriving at the cap prunes the job that ended first, sooner.
JOB_RETENTION_S = 24 * 3600.0
# Per-window communication figures (perfd.core.winfigures rows, a rank a window) a job's collective fold holds
# for its analysis: the newest iterations, whole, up to this many rows, before its iterations' own cap
# (CollectiveConfig: the newest 100). At 100,000 ranks 100 iterations were ~10 million rows and most of
# the engine root's 7.1 GiB (docs/evidence/entries/48-scale-history.md); this keeps 40 iterations there (~0.5
# KB a row), and every
# one of them up to 40,000 ranks. The iterations let go for it are counted (``evicted_for_rows``).
MAX_FIGURE_ROWS_PER_JOB = 4_000_000
# The collective analysis's summary of each rank's communication share: over its newest this many
# complete windows; and the newest iterations it lists (CollectiveConfig's defaults; the engine's shards
# and root summarise and answer over the same: perfd.core.commsummary).
COMM_RECENT_WINDOWS = 50
COMM_ITERATIONS_OUT = 100
# A job's collective analysis (the aggregator's) and its shards' communication summaries are made again
# no sooner than this many times what the last took: a 100,000-rank job's takes ~20 s of CPU (perfd bench
# collectives), which made again as soon as its records changed — every node message — would hold a
# core; and no sooner than ANALYSIS_MIN_EVERY_S after the last.
ANALYSIS_COST_FACTOR = 10
ANALYSIS_MIN_EVERY_S = 0.5
# Retention of each job's step records (perfd.aggregator.jobs keeps the window): the newest
# RETAIN_ITERATIONS iterations, and no more than RETAIN_BYTES of them (estimated by record_bytes): with
# per-rank timers a record of a 1,000-rank job holds ~1.3 MB, so iterations alone would let one job
# take gigabytes. `perfd aggregator --retain-iterations / --retain-mib` set them.
RETAIN_ITERATIONS = 5000
RETAIN_BYTES = 256 << 20
# An agent whose stream closed is forgotten (its series leave the cap, its latest values the joins)
# this long after, unless it comes back: longer than the 10-minute network cut the spool rides out.
AGENT_RETENTION_S = 15 * 60.0
RANK_RATIO_TOP_K = 8  # slowest ranks per job always on /metrics (perfd_job_slowest_rank_compute_times)
MAX_SERIES = 1_000_000  # node series held, all agents together
# ... of one identity (as MAX_JOBS_PER_IDENTITY; --max-series-per-identity): a tenth of the cap, two
# agents' worth (a node's agents define a few hundred each). At 500,000 one client held ~940 MB of
# series. Many agents behind one address without credentials (a load generator,
# NAT) need it raised; the shared bearer token names every agent alike and has no quota of its own.
MAX_SERIES_PER_IDENTITY = 100_000
MAX_LABELS_PER_SERIES = 16
MAX_LABEL_VALUE_BYTES = 256
MAX_JOB_NAME_BYTES = 256
# A step record more than this many iterations ahead of the newest its job holds is implausible
# (refused, reason iteration_ahead), as is one beyond its run's train-iters: one far-future iteration
# among good ones once became a retention watermark that dropped every later record.
# Far above any real gap between two records of a job (a log interval of 1,000, hours of lost
# records); a run that restarts from a checkpoint ahead is a new run and its first record says so.
MAX_ITERATION_LEAP = 100_000

# ---- captures -------------------------------------------------------------------------------------
MAX_CAPTURE_STEPS = 50  # iterations one capture may cover (HTTP API and webhook alike)
CAPTURE_REQUESTS_PER_JOB = 5  # requests (HTTP API and webhook) accepted per job ...
CAPTURE_RATE_WINDOW_S = 300.0  # ... in this sliding window
MAX_CAPTURE_RECORDS = 1_000  # capture records kept; the oldest finished ones are pruned first
# ... and what they hold in all beyond their fixed fields (perfd.aggregator.capture_records.record_bytes:
# names, texts, ranks, the agents' reported results, each result at most MAX_EVENT_BYTES), the oldest
# ended ones pruned first: 1,000 results of 256 KiB would otherwise be held (and kept in the state dir).
MAX_CAPTURE_RECORD_BYTES = 64 << 20
MAX_ALERTS_PER_WEBHOOK = 100  # alerts of one Alertmanager POST that may ask for a capture
# Distinct ranks one requested capture may name (HTTP API and webhook alike; perfd.aggregator.
# capture_ranks). Real requests name a few: the rules take one rank, an incident's (at most 4) or a
# node's (a node runs 8-16), a person the ranks they look at; every rank of a job is asked for by
# naming none (the command's empty rank list), which costs no more. 500,000 ranks in one request held
# 7.5 MB a record: 60 of them took the aggregator from 68 to 498 MB.
MAX_CAPTURE_RANKS = 256
# Nsight Compute ranges (perfd.capture.ncu_exec): what a rank under ncu may cost, fixed when it starts
# (ncu's filters are its command line and count over the whole process). Measured on the H100 with
# perfd's five sections (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, ComputeWorkloadAnalysis:
# ncu replays each kernel 19 times), 12-layer Megatron-LM, 2026-11-25 (docs/evidence/ncu_workflow_h100/):
# 72 launches each range, the first profiled 11.6 and 11.7 s after the range opened (ncu setting up its
# first profile), then one every 0.90 s (median; 64.4 and 65.1 s for the other 71); the ranges were
# held 78.0 and 79.0 s. (An earlier 0.61 s a kernel was measured with 13 passes: fewer sections.)
NCU_REPLAY_S_PER_KERNEL = 0.91
NCU_RANGE_SETUP_S = 11.0  # before a range's first profiled launch is done, besides its replay
NCU_BUDGET_MARGIN = 1.25  # a default time budget: the range's estimate and a quarter (the step's rest)
NCU_LAUNCH_COUNT = 40  # kernels one rank profiles (its --launch-count), over all its ranges
MAX_NCU_LAUNCH_COUNT = 1_000
MAX_NCU_LAUNCH_SKIP = 1_000_000  # launches a range lets pass first (a step's: thousands to tens of thousands)
NCU_TIME_BUDGET_S = 90.0  # one range, at least; past it the capture closes the range and says it overran
MAX_NCU_TIME_BUDGET_S = 1_800.0
# A Kineto / Chrome trace file read by the agent (written by the job's process) or `perfd analyze`
# (perfd.capture.trace_input), bounded while it streams in, never after it is inflated: a 0.5 MB gzip
# of whitespace inflated to 1 GB and took a root agent from 62 to 1,092 MB. Sized
# from the largest real traces kept (tests/data/captures: 36.5 MB of JSON and 2.43 M values inflated
# from a 2.1 MB .json.xz, read in a 302 MB peak; compressed up to 2.2 MB): 3.5x the text and 3.3x the
# values, 15x the compressed file (a plain file is held to the text's budget). The values (commas and
# opening brackets: an upper bound) bound what the parse builds (`[{},{},...]` is a dict per 3 bytes).
MAX_TRACE_INFLATED_BYTES = 128 << 20
MAX_TRACE_FILE_BYTES = 32 << 20
MAX_TRACE_JSON_VALUES = 8_000_000
# Why a trace was refused (the agent's perfd_agent_collector_errors_total{collector="captures",reason};
# the capture fails, or goes partial, with the sentence): not a regular file or over its file cap; text
# past MAX_TRACE_INFLATED_BYTES (charged the width it decodes or its \u escapes parse to: 2 or 4 bytes a
# character); more than MAX_TRACE_JSON_VALUES values;
# nested deeper than the JSON parser recurses; backward work whose part is found through more than
# MAX_TRACE_AUTOGRAD_LINKS autograd links (perfd.capture.ops).
TRACE_REFUSED_FILE = "trace_file"
TRACE_REFUSED_INFLATED = "trace_inflated"
TRACE_REFUSED_VALUES = "trace_json_values"
TRACE_REFUSED_DEPTH = "trace_json_depth"
TRACE_REFUSED_NESTING = "trace_nesting"
TRACE_REFUSED_REASONS = (TRACE_REFUSED_FILE, TRACE_REFUSED_INFLATED, TRACE_REFUSED_VALUES,
                         TRACE_REFUSED_DEPTH, TRACE_REFUSED_NESTING)
# Op attribution (perfd.capture.ops) is linear in a trace's ranges however deeply they nest, but a
# backward unit's part is found through autograd's links (unit -> its forward op, itself in a unit
# linked on ...), each adding " (backward)" to the label: n links nested n deep are n² of text. The
# real traces (tests/data/captures) follow 2 at most (a node between linked neighbours, then its
# forward op); a double backward adds one a level. Past this the trace is refused (trace_nesting).
MAX_TRACE_AUTOGRAD_LINKS = 32

# ---- rank processes on a node (collectors/ranks, perfd/agent/stacks.py) ----------------------------
# What the agent reads of a job's rank processes stays bounded whatever runs on the node: measured in
# `perfd bench ranks` (benchmarks/README.md).
MAX_RANKS_PER_AGENT = 256  # rank processes one agent follows (a node runs 8-16); more are counted
MAX_RANK_THREADS = 1024  # threads of one rank whose schedstat is read per collect (Megatron: ~100)
MAX_SCAN_PIDS = 16_384  # processes one contention scan reads (/proc/*/stat); past it counted, cut
RANK_CHILDREN_MAX = 256  # a rank's descendants (data-loader workers) whose CPU use is read per collect
RANK_OTHERS_TOP_N = 8  # other processes named per rank (pid, user, command, CPU share): a payload
MAX_RANK_PAYLOAD_CMDLINE = 200  # characters of a named process's command line
STACK_TIMEOUT_S = 10.0  # one py-spy dump (it reads a stopped process too, --nonblocking)
STACK_BYTES_PER_RANK = 16 << 10  # of one rank's stack text; the rest cut and said
MAX_STACK_RANKS = 16  # ranks dumped per request (a stall names the stuck ones first)
MAX_RANK_WORKERS = 64  # a rank's descendant processes (data-loader workers) whose CPU time is read
RANK_WORKERS_EVERY = 10  # collects between walks of a rank's process tree (its children files)

# ---- the step hook (perfd/hook, collectors/hook) ------------------------------------------------------
# Step records a hook keeps while the agent is absent or busy (a job started before its agent listens:
# the first 35 steps of one were lost), sent oldest first once it answers. 104 bytes a record: ~420 KiB
# at most, a few minutes of a 50 ms step. Past it the oldest are dropped and counted (send_drops).
HOOK_BACKLOG_RECORDS = 4096
HOOK_BACKLOG_SENDS = 8  # held datagrams one flush sends before its own (the agent queues ~10)
HOOK_BACKLOG_BYTES = 1 << 20  # ... and their bytes (a record is 104 B: the count binds first)
# At the hook's close, how long what is held is tried again while the agent is there but busy (its queue
# full): the job has ended and its last steps are its run's end (a loaded test's job lost its last 4 of
# 60 steps, likely so: one try). An absent agent is not waited for.
HOOK_CLOSE_DRAIN_S = 2.0
HOOK_TRACE_PATH_MAX_BYTES = 1024  # the path of a written trace a hook reports (UTF-8)
HOOK_MAX_RANKS = 4096  # ranks one hook collector keeps peers, devices and job flags of (far above a node's)
# Steps one profiler range or Kineto trace may cover, as the hook checks a request: four times the
# aggregator's default MAX_CAPTURE_STEPS (an operator may raise that). A 10^6-step trace once slowed
# a job's steps from 81 to 534 ms and grew its RSS 33 MB in 90 s.
HOOK_MAX_STEPS = 200
# A Kineto trace the hook opened is stopped at the next step boundary once it has run this long, or
# once the process's resident memory grew this much since it began (what it traced is kept); a
# written trace larger than HOOK_TRACE_MAX_BYTES is deleted and the request fails.
HOOK_TRACE_MAX_S = 600.0
HOOK_TRACE_RSS_GROWTH_MAX = 2 << 30
HOOK_TRACE_MAX_BYTES = 1 << 30
HOOK_TRACE_FILES_KEPT = 4  # a hook's own written traces left for the agent; older ones deleted
HOOK_OUTBOX_MAX = 64  # statuses waiting for the harvester (each at most ~1.1 KB); oldest dropped
# The agent's receive queue (collectors/hook): datagrams received and not yet collected, by count and
# by bytes (a datagram is at most 64 KiB; 200,000 of them once took a root agent from 55 MB to
# 3.66 GB). An 8-rank node sends ~300 KB/s: 8 MiB holds ~30 s of it. Past either, the oldest go.
HOOK_QUEUE_MAX = 200_000
HOOK_QUEUE_MAX_BYTES = 8 << 20
HOOK_QUEUE_ITEM_OVERHEAD = 200  # bytes one queued datagram costs beyond its payload (objects)
# One sending process (the kernel's pid) may hold at most 1/HOOK_QUEUE_SHARES of that queue, in count
# and in bytes (1 MiB: ~30 s of one rank), so one process cannot crowd out the job's others; past its
# share its new datagrams are dropped and counted (queue_share_full).
HOOK_QUEUE_SHARES = 8
# Profile and trace requests the agent has sent and not seen end, and hook_profile statuses kept for
# the captures waiting on them: a status for a request not sent to that process is refused.
HOOK_MAX_OUTSTANDING = 1024
HOOK_MAX_STATUSES_PER_REQUEST = 16

# ---- HTTP -----------------------------------------------------------------------------------------
# perfd.exporters.httpd: one thread reads and writes every connection, workers only compute, so a
# slow or idle client costs a buffer, never a thread; these bound what a connection may hold.
MAX_HTTP_BODY_BYTES = 1 << 20
# Answers: one answer larger than this is not sent (503, ``http_answer``: ask for less — the event
# log is paged); all answers waiting for their clients to read them together at most the second,
# the connection that has read nothing for longest making room (30 clients that never read a 50 MB
# /api/events once held 2 GB).
MAX_HTTP_ANSWER_BYTES = 64 << 20
MAX_HTTP_OUTPUT_BYTES = 256 << 20
# The kernel's send buffer of each HTTP connection (SO_SNDBUF; Linux doubles it): loopback autotuning
# let one unread answer park 4 MB in the kernel, past every bound above.
HTTP_SEND_BUFFER_BYTES = 256 << 10
EVENTS_PAGE = 200  # /api/events: events per page by default (?limit=) ...
MAX_EVENTS_PAGE = 1000  # ... at most ...
MAX_EVENTS_PAGE_BYTES = 1 << 20  # ... and about this many bytes of events
MAX_HTTP_HEAD_BYTES = 64 << 10  # request line and headers (431 beyond)
HTTP_HEADER_TIMEOUT_S = 5.0  # the request line and every header within this long of the accept
HTTP_REQUEST_TIMEOUT_S = 30.0  # head and body within this long (1 MiB at 35 KB/s)
HTTP_IDLE_TIMEOUT_S = 10.0  # a connection that sends nothing (or reads nothing of its answer) this long
HTTP_WRITE_TIMEOUT_S = 30.0  # the whole answer read by the client within this long
# Open connections (a buffer each); at the cap the one waiting longest for its request makes room.
MAX_HTTP_CONNECTIONS = 512
HTTP_LISTEN_BACKLOG = 1024  # the kernel caps it at net.core.somaxconn (4096 on current kernels)
HTTP_PROBE_THREADS = 2  # the lane of /metrics and /healthz, which API clients cannot fill
HTTP_API_THREADS = 4  # every other path
HTTP_LANE_QUEUE = 64  # complete requests waiting for a lane's threads (503 beyond)
HTTP_TICK_S = 0.25  # how often the deadlines are checked

REFUSAL_LOG_INTERVAL_S = 60.0

# ---- reasons of perfd_aggregator_refused_total ---------------------------------------------------
REFUSED_UNAUTHENTICATED = "unauthenticated"  # no or wrong token / client certificate
REFUSED_TOKEN_ROTATED = "token_rotated"  # an open stream closed: its bearer token was rotated since
REFUSED_IDENTITY = "identity_mismatch"  # an agent id claimed by other credentials
REFUSED_POLICY = "identity_policy"  # an agent id or a job the identity policy does not give that identity
REFUSED_NOT_HOST = "not_host"  # step records or job info from an agent not hosting the job
REFUSED_STREAMS = "streams"  # MAX_STREAMS open
REFUSED_HELLO_TIMEOUT = "hello_timeout"
REFUSED_SILENT = "silent_stream"  # AGENT_SILENCE_S without a message
# A new stream while the aggregator is saturated: its event loop lags MAX_LOOP_LAG_S, or its opening
# streams wait for their first Ack (MAX_OPENING_STREAMS, MAX_FIRST_ACK_WAIT_S).
REFUSED_OVERLOADED = "overloaded"
REFUSED_JOBS = "jobs_cap"
REFUSED_JOBS_QUOTA = "jobs_quota"  # an agent or identity at its own share of the jobs cap
REFUSED_SERIES = "series_cap"
REFUSED_SERIES_QUOTA = "series_quota"  # an identity at its own share of the series cap
REFUSED_LABELS = "label_cap"  # too many labels or a label value too long
REFUSED_EVENT_BYTES = "event_bytes"
REFUSED_EVENT_CUT = "event_cut"  # an event kept cut to MAX_KEPT_EVENT_BYTES (counted per event)
# An event the log let go because its pool (a job's events, or one sender's job-less ones) passed its
# share of the log (EVENT_LOG_SHARES): the pool's own oldest go, counted per event under its newest sender.
REFUSED_EVENT_SHARE = "event_share"
REFUSED_CAPTURE_RATE = "capture_rate"
REFUSED_CAPTURE_STEPS = "capture_steps"
REFUSED_WEBHOOK_ALERTS = "webhook_alerts"
# A capture request naming a rank outside 0..world size (or perfd.aggregator.capture_ranks.MAX_RANK),
# a rank that is no integer, or more than MAX_CAPTURE_RANKS ranks (HTTP 400; a webhook alert refused).
REFUSED_CAPTURE_RANKS = "capture_ranks"
REFUSED_HTTP_BODY = "http_body"
REFUSED_HTTP_CONNECTIONS = "http_connections"  # MAX_HTTP_CONNECTIONS or a lane's queue full
REFUSED_HTTP_DEADLINE = "http_deadline"  # a request (or the reading of its answer) past its deadline
REFUSED_HTTP_HEAD = "http_head"  # a head over MAX_HTTP_HEAD_BYTES
# An answer over MAX_HTTP_ANSWER_BYTES, or a connection closed to keep MAX_HTTP_OUTPUT_BYTES.
REFUSED_HTTP_ANSWER = "http_answer"
REFUSED_JOB_INFO_VALUE = "job_info_value"  # a value outside perfd.core.bounds (it becomes absent)
# A value of a step record outside perfd.core.bounds (check_step_record): it becomes absent, the record is
# kept.
REFUSED_STEP_VALUE = "step_value"
# A step record for an (iteration, rank) of a job already held from another agent: the held one stays
# (event perfd.core.events.STEP_CONFLICT names both agents).
REFUSED_STEP_CONFLICT = "step_conflict"
REFUSED_WORSE_DUPLICATE = "worse_duplicate"  # a copy of a held step record lacking some of its values
# Held step records of an agent that wrote a job's iterations ahead of it, replaced by the records of
# the host that continues the job (docs/reliability.md "Who may write a job"); counted under that agent.
REFUSED_STEP_AHEAD = "step_ahead"
# A step record whose iteration is implausibly ahead (MAX_ITERATION_LEAP, the run's train-iters).
REFUSED_ITERATION_AHEAD = "iteration_ahead"
REFUSED_NOT_TARGET = "not_target"  # a capture's progress from an agent the capture was not sent to
# An event, or an entry of its payload, that is not of the type its kind declares (perfd.core.events.checked):
# refused where it enters the aggregator (live or replayed from the state store), never read further.
REFUSED_MALFORMED_EVENT = "malformed_event"
# What perfd.exporters.httpd counts (the agent's /metrics and the aggregator's HTTP alike): the
# agent serves perfd_agent_http_refused_total for each from 0.
REFUSED_HTTP_REASONS = (REFUSED_HTTP_BODY, REFUSED_HTTP_CONNECTIONS, REFUSED_HTTP_DEADLINE, REFUSED_HTTP_HEAD,
                        REFUSED_HTTP_ANSWER)
REFUSED_REASONS = (
    REFUSED_UNAUTHENTICATED, REFUSED_TOKEN_ROTATED, REFUSED_IDENTITY, REFUSED_POLICY, REFUSED_NOT_HOST,
    REFUSED_STREAMS,
    REFUSED_HELLO_TIMEOUT, REFUSED_SILENT, REFUSED_OVERLOADED, REFUSED_JOBS, REFUSED_JOBS_QUOTA,
    REFUSED_SERIES, REFUSED_SERIES_QUOTA, REFUSED_LABELS, REFUSED_EVENT_BYTES, REFUSED_EVENT_CUT,
    REFUSED_EVENT_SHARE,
    REFUSED_CAPTURE_RATE, REFUSED_CAPTURE_STEPS, REFUSED_WEBHOOK_ALERTS, REFUSED_CAPTURE_RANKS,
    *REFUSED_HTTP_REASONS,
    REFUSED_JOB_INFO_VALUE, REFUSED_STEP_VALUE, REFUSED_STEP_CONFLICT, REFUSED_WORSE_DUPLICATE,
    REFUSED_STEP_AHEAD,
    REFUSED_ITERATION_AHEAD, REFUSED_NOT_TARGET, REFUSED_MALFORMED_EVENT,
)


@dataclass
class Limits:
    """The caps in force in one aggregator (defaults above; flags override some)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_streams: int = MAX_STREAMS
    max_series_per_agent: int = MAX_SERIES_PER_AGENT
    max_event_bytes: int = MAX_EVENT_BYTES
    max_jobs: int = MAX_JOBS
    max_jobs_per_agent: int = MAX_JOBS_PER_AGENT
    max_jobs_per_identity: int = MAX_JOBS_PER_IDENTITY
    max_series: int = MAX_SERIES
    max_series_per_identity: int = MAX_SERIES_PER_IDENTITY
    job_retention_s: float = JOB_RETENTION_S
    agent_retention_s: float = AGENT_RETENTION_S
    max_capture_steps: int = MAX_CAPTURE_STEPS
    capture_requests_per_job: int = CAPTURE_REQUESTS_PER_JOB
    capture_rate_window_s: float = CAPTURE_RATE_WINDOW_S
    max_capture_records: int = MAX_CAPTURE_RECORDS
    max_capture_record_bytes: int = MAX_CAPTURE_RECORD_BYTES
    agent_silence_s: float = AGENT_SILENCE_S
    hello_timeout_s: float = HELLO_TIMEOUT_S
    max_loop_lag_s: float = MAX_LOOP_LAG_S
    max_opening_streams: int = MAX_OPENING_STREAMS
    max_loop_busy: float = MAX_LOOP_BUSY
    max_loop_busy_s: float = MAX_LOOP_BUSY_S
    max_first_ack_wait_s: float = MAX_FIRST_ACK_WAIT_S
