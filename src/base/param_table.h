/*
 * param_table.h: every Chorus parameter, declared once.
 *
 * PARAM(NAME, TYPE, DEFAULT, NCCL_ALIAS, HELP)
 *   NAME        read from CHORUS_<NAME> (primary spelling)
 *   TYPE        INT (64-bit, accepts K/M/G suffixes) or STR
 *   DEFAULT     for INT a number, for STR a string literal (or NULL)
 *   NCCL_ALIAS  1 when NCCL has the same knob: NCCL_<NAME> is accepted too (CHORUS_ wins)
 *
 * PARAM_RANGE(NAME, MIN, MAX)  (the block at the end of the file)
 *   the valid values of an INT parameter, both ends included. A value outside, or one that is not
 *   an integer (or overflows with its suffix), fails chorus_param_init and so ncclCommInit* with
 *   ncclInvalidArgument and a WARN naming the variable, the value and the range. Every INT
 *   parameter has a row (a unit test checks it).
 *
 * This table generates the parsing step (src/base/param.c), `chorus_info --params` and the README
 * table. No other file reads the environment. An includer defines PARAM, and PARAM_RANGE where it
 * wants the ranges (otherwise they expand to nothing).
 */
#ifndef PARAM_RANGE
#define PARAM_RANGE(name, min, max)
#define CHORUS_PARAM_RANGE_EMPTY_
#endif
/* logging */
PARAM(DEBUG, STR, NULL, 1, "log level: VERSION, WARN, INFO, TRACE")
PARAM(DEBUG_SUBSYS, STR, "INIT,ENV", 1, "subsystems logged at INFO (INIT,COLL,P2P,SHM,NET,GRAPH,TUNING,ENV,ALLOC,CALL,PROXY,BOOTSTRAP,REG,ALL; ^ excludes)")
PARAM(DEBUG_FILE, STR, NULL, 1, "log file name; %h host, %p pid")
/* bootstrap and deadlines */
PARAM(TIMEOUT, INT, 300, 0, "seconds any wait may last before it fails (init, transfers, collectives)")
PARAM(WARN_INTERVAL, INT, 30, 0, "seconds between the WARNs of a wait that lasts (which op or setup, which peer, how long so far); 0: none")
PARAM(COMM_ID, STR, NULL, 1, "host:port of the bootstrap root (rank 0 listens there)")
PARAM(JOB_SECRET, STR, NULL, 0, "the job's shared secret (any text, best 32+ random characters; never logged): with a fixed root address (COMM_ID, MASTER_ADDR:MASTER_PORT) only processes that know it can join the job. chorusrun sets a random one for the ranks it starts on one node")
PARAM(JOB_SECRET_FILE, STR, NULL, 0, "file holding JOB_SECRET (first line; must not be accessible by group or others, e.g. mode 0600)")
PARAM(COMM_ID_INSECURE, INT, 0, 0, "1: a fixed root address without JOB_SECRET derives the job's secret from the address text, as NCCL does: any process that can reach the port can join the job and read its data")
PARAM(SOCKET_IFNAME, STR, NULL, 1, "network interfaces to use: prefix list, ^ excludes, = exact match")
PARAM(SOCKET_FAMILY, STR, NULL, 1, "AF_INET or AF_INET6 to force an address family")
/* transports */
PARAM(TRANSPORT, STR, NULL, 0, "force one transport for every peer (shm, tcp, cuda_ipc, ib)")
PARAM(SHM_DISABLE, INT, 0, 1, "1: never use shared memory between local processes")
PARAM(P2P_DISABLE, INT, 0, 1, "1: never use CUDA IPC")
PARAM(CUDA_STAGE_COPY, INT, -1, 0, "device-buffer ops: how the copies to and from pinned staging and the stream's wait for the worker run. 1: kernels (SM loads and stores): a waiting op holds no copy-engine or front-end queue, which ranks that are threads of one process on one GPU share (with copy engines they stalled); 0: cudaMemcpyAsync and a stream memory wait (between processes a spinning kernel would hold the GPU for a whole time slice, 2.3 ms per op on an H100); -1: 1 where another rank of the communicator is a thread of this process on the same GPU, else 0")
PARAM(CUDA_IPC_DEVICE_SLOTS, INT, 0, 0, "1: let a forced cuda_ipc transport carry chunks in GPU-memory slots (device-aware callers and tests; the collective engine drives host-memory slots only)")
PARAM(DEVICE_PATH, STR, "auto", 0, "how collectives on device buffers run: kernel (the collective kernel on the user's stream over slots in device memory: for ranks that are threads of one process on one device, or processes of one host, each rank's slots and counters in its own device memory that its peers map, on GPUs that reach each other's memory; processes sharing a GPU without MPS run their kernels by turns, slowly: ce suits them; ranks on several hosts: each rank's slots and counters in its own pinned, mapped host memory, which a proxy thread per rank forwards over the transports), ce (copy-engine programs on the user's stream: stream waits and writes on counters in shared host memory, copies and reduction kernels over slots in device memory shared by CUDA IPC, for ranks on one host; a GPU without 64-bit stream memory operations runs staged), staged (copies to pinned host memory and the host engine on a worker thread), auto (kernel for thread ranks on one device, from 2 ranks on a GPU; processes and ranks on several hosts stay staged on a GPU, where neither ce nor the kernel between processes or hosts has run yet; under the emulator processes of one host take ce, ranks on several hosts the kernel). Ranks the chosen path cannot serve run staged, and so does a PreMulSum whose scalar is in device memory")
PARAM(DEVICE_CHANNELS, INT, 0, 0, "device path on a GPU: channels (one block each) an op of the collective kernel uses at most; every rank's blocks must be resident on the GPU at once, since they wait for each other. 0: 32 for up to 4 ranks, else 64 / ranks; between hosts 2")
PARAM(DEVICE_SLOT_BYTES, INT, 1048576, 0, "device path on a GPU: bytes of one SIMPLE slot of a connection (the largest chunk; an op spreads over every channel in chunks down to a sixteenth of it); 8 slots a connection, 4 between hosts (in pinned host memory)")
PARAM(DEVICE_LL_MAX, INT, 2048, 0, "device path on a GPU: ops of at most this many bytes use the low-latency protocol (flag-in-line 8-byte words, 4 KiB slots); larger ones the SIMPLE slots")
PARAM(DEVICE_VEC, INT, 1, 0, "device path on a GPU: 1 moves chunks in 16-byte accesses where the buffers allow (aligned), 0 one element per access")
PARAM(DEVICE_DIRECT, INT, -2, 0, "device path, ranks that are threads of one process on one device (collective kernel): all-reduce, reduce-scatter, all-gather and broadcast of at least this many bytes (a rank's larger buffer) run direct: each rank reads its share of every peer's buffer and writes every output once, with no slots, synchronised by counters in device memory. -2 (the default): 0 under the device emulator, -1 on a GPU until the direct kernel has run on one (it is checked under the emulator only); 0: every size (not yet measured on a GPU: on one device two synchronisations an op against the ring's 2n-1 dependent steps, and a choice no rank's count can tip, so a mismatched count is always caught); N > 0: from N bytes (ranks whose counts straddle N are caught when a slot op's header reaches a direct rank, else at CHORUS_TIMEOUT); -1: never (the ring over slots)")
PARAM(DEVICE_NET_DIRECT, INT, 1, 0, "device path between hosts: 1 connects ranks of one host through device memory their kernels share (each receiver's slots and counters, mapped by its peers on that host, as between processes of one host; GPUs that reach each other), 0 sends those connections through the proxies and shared memory too")
PARAM(DEVICE_EMU, INT, 0, 0, "testing only: 1 runs the device path on the device runtime's emulator (host threads stand in for the GPU; emulated device memory from the test helpers), with or without a GPU")
PARAM(IB_DISABLE, INT, 0, 1, "1: never use RDMA verbs")
PARAM(IB_HCA, STR, NULL, 1, "RDMA devices to use (same syntax as SOCKET_IFNAME)")
PARAM(IB_GID_INDEX, INT, -1, 1, "RoCE GID index (-1: the first RoCE v2 GID of the port)")
PARAM(IB_TIMEOUT, INT, 20, 1, "RDMA ack timeout exponent: 4.096 us x 2^value")
PARAM(IB_RETRY_CNT, INT, 7, 1, "RDMA transport retries before a queue pair fails")
PARAM(IB_ROCE_VERSION_NUM, INT, 2, 1, "RoCE version of the GID chosen when IB_GID_INDEX is -1 (1 or 2)")
PARAM(IB_ADDR_FAMILY, STR, "AF_INET", 1, "address family of the RoCE GID chosen when IB_GID_INDEX is -1: AF_INET (IPv4-mapped) or AF_INET6")
PARAM(IB_TC, INT, 0, 1, "RoCE traffic class of the verbs queue pairs")
PARAM(IB_SL, INT, 0, 1, "InfiniBand service level of the verbs queue pairs")
PARAM(IB_ZCOPY_THRESHOLD, INT, 65536, 0, "chunks from this many bytes in buffers registered with ncclCommRegister go over verbs without a copy (the receiver reads them from the sender's buffer); -1: never")
PARAM(IB_QPS_PER_CONNECTION, INT, 1, 1, "queue pairs per verbs connection (the two ends use the smaller count); IB_SPLIT_DATA_ON_QPS picks how chunks use them")
PARAM(IB_SPLIT_DATA_ON_QPS, INT, 0, 1, "with several queue pairs per verbs connection: 1 splits each chunk (and each read of a registered buffer) into one part per queue pair, 0 sends each chunk whole on the next queue pair, round-robin. Split only when both ends ask for it")
PARAM(IB_LIBRARY, STR, NULL, 0, "verbs library the ib transport loads instead of libibverbs.so.1 (a file name or path; the tests name the software provider libchorus_softib.so)")
PARAM(NET, STR, NULL, 1, "network transport to use between hosts (Socket or IB)")
PARAM(CONNECT, STR, "lazy", 0, "connect transports lazily on first use or eagerly at init: lazy|eager")
PARAM(BUFFSIZE, INT, 4194304, 1, "bytes of chunk slots per connection")
PARAM(NSLOTS, INT, 8, 0, "chunk slots per connection (credits in flight)")
PARAM(P2P_NSLOTS, INT, -1, 0, "chunk slots of a point-to-point connection (send/recv, all-to-all, a collective's partners outside the rings), at most NSLOTS; slots keep the full size (-1: NSLOTS up to 8 ranks, 2 from 9 ranks)")
PARAM(SHM_MAX_BYTES, INT, 1073741824, 0, "bytes of /dev/shm a rank's shared-memory segments may take in all; past it a new segment gets fewer slots, down to 1, and then the connection fails naming this limit (0: no limit)")
PARAM(SHM_CMA, INT, -1, 0, "single-copy through process_vm_readv: -1 auto (probe), 0 off, 1 required")
PARAM(SHM_SLOT_STREAM, INT, -1, 0, "how a shm sender writes chunks of 32 KiB and more into the slots: -1 measured (with exactly two ranks on the host, ring and one-shot all-reduce, reduce-scatter and all-gather take one mode per communicator from whole ops timed in probe windows every rank runs alike; other chunks, and every chunk with more ranks on the host: per connection, streaming stores where its plain copies run more than twice slower), 0 plain stores, 1 streaming stores")
PARAM(SHM_CMA_THRESHOLD, INT, -1, 0, "bytes from which a shm transfer uses single-copy (-1: 256 KiB, except point-to-point transfers between processes, which always go through the slots)")
PARAM(SHM_CMA_COOP, INT, 1, 0, "1: the sender copies part of a large single-copy chunk itself (process_vm_writev), so two cores share it; 0: the receiver copies alone")
PARAM(SHM_CMA_BLOCK, INT, 1048576, 0, "bytes per block of a cooperative single-copy chunk; chunks of at least two blocks are shared")
PARAM(SOCKET_NTHREADS, INT, 1, 1, "TCP helper threads a connection uses: its socket i is served by the process's helper i % N, and the helpers are shared by all connections of the process (0: none, the caller moves all data and must call progress)")
PARAM(SOCKET_SHARE, INT, -1, 0, "TCP: a point-to-point connection to a rank that already has a one-socket connection of the other direction from this communicator shares that socket, one direction each (-1: from 9 ranks, where a rank's peers add up; 1: always; 0: never; ring connections never)")
PARAM(SOCKET_HELPERS, INT, 4, 0, "most TCP helper threads a process runs, shared by its connections: a connection gets helpers of its own while there are fewer than this many (at least SOCKET_NTHREADS), then shares the least busy; a sender's helper starts at its first commit the kernel could not take at once")
PARAM(NSOCKS_PERTHREAD, INT, 1, 1, "TCP sockets per helper thread")
PARAM(SOCKET_RECV_NTHREADS, INT, 0, 0, "TCP helper threads on the receiving end of a connection (0: the caller reads inline, the kernel buffers meanwhile; -1: as SOCKET_NTHREADS)")
PARAM(SOCKET_MIN_SPLIT, INT, 65536, 0, "smallest TCP piece when a chunk is split across sockets")
PARAM(SOCKET_BUFFSIZE, INT, 0, 0, "TCP data socket SO_SNDBUF/SO_RCVBUF bytes (0: kernel autotuning)")
PARAM(SOCKET_DIRECT_THRESHOLD, INT, 262144, 0, "bytes from which TCP sends from and receives into user buffers, skipping the slots (0: never)")
PARAM(SOCKET_RING_TUNE, INT, -1, 0, "choices for rings whose every edge is TCP, a bit mask: 1 power-of-two chunks, 2 single copy for copy steps, 4 single copy for reduce steps too, 8 never the streamed mode (-1: the measured defaults, 15 for all-reduce and 14 for the other ring collectives; 0: as shared memory; tuner.c)")
/* topology */
PARAM(TOPO_FILE, STR, NULL, 1, "hwloc XML file to load instead of discovering the machine")
PARAM(TEST_HOSTS, STR, NULL, 0, "testing only: comma-separated host names by rank (entry r is rank r's; ranks past the list keep the real one), so that ranks on one machine see each other as other hosts: shared memory only within a name, TCP between names, and the algorithms across hosts")
PARAM(RING_ORDER, STR, NULL, 0, "comma-separated rank order that overrides the ring search")
PARAM(CPU_BIND, STR, "none", 0, "bind ranks to CPUs: auto, none, or a list")
PARAM(MIN_NCHANNELS, INT, 1, 1, "fewest rings")
PARAM(MAX_NCHANNELS, INT, 16, 1, "most rings")
/* collectives and tuning */
PARAM(ALGO, STR, NULL, 1,
      "algorithms allowed (ring, ll, oneshot, direct, tree, hier), NCCL's syntax: ^ excludes, per "
      "collective after ';' (ring,oneshot;allreduce:^ll)")
PARAM(COST_MODEL, STR, NULL, 0,
      "the tuner's link constants, class=alpha_us/GBps entries for shm, tcp_intra, tcp_inter, ib "
      "(tcp_inter=1000/0.125: 1 ms per hop, 1 Gbit/s), or @file holding such entries")
PARAM(LL_THRESHOLD, INT, -1, 0, "bytes below which the low-latency algorithm runs (-1: tuner decides)")
PARAM(ONESHOT_THRESHOLD, INT, -1, 0, "bytes up to which all-reduce, reduce-scatter and all-gather (total size) between ranks of one host run one-shot (every rank sends to every rank; -1: tuner decides, 0: off)")
PARAM(DIRECT_THRESHOLD, INT, -1, 0, "bytes (total for reduce-scatter and all-gather) from which all-reduce, reduce-scatter and all-gather between ranks that are threads of one process run the direct algorithm (each rank reads its share of every input and writes every output it produces; -1: tuner decides, 0: never)")
PARAM(RING_DIRECT, INT, -1, 0, "single copy (the transport's direct path) in ring all-reduce, reduce-scatter and all-gather: -1 auto (between threads of one process, where it is a plain copy; between processes from 4 MiB, below which the slots measured faster than process_vm_readv), 1 wherever the transport allows, 0 never")
PARAM(TREE_LAG, INT, -1, 0, "tree and hier all-reduce: how many pieces (hier: columns) a tree connection's chunks going up may run ahead of its chunks going down (-1: twice the depth of the tree; 0: piece order, where each direction of a link waits for the other)")
PARAM(DIRECT_REDUCE, INT, 0, 0, "1: reduce steps of large chunks go single copy too where RING_DIRECT allows (the receiver pulls the data into a cache-sized buffer and reduces from there); 0: through the slots")
PARAM(STREAM_THRESHOLD, INT, -1, 0, "bytes of a collective from which its final output is written with streaming stores (-1: half the last-level cache, at least 16 MiB; 0: never)")
PARAM(STREAM_CHUNK, INT, -1, 0, "bytes per chunk of a ring collective whose output is streamed (see STREAM_THRESHOLD): its chunks go through the slots, and nslots x this many bytes stay in cache (-1: the smallest L2 of the ranks / NSLOTS, a power of two within 32-256 KiB)")
PARAM(SHM_RING_CHUNK, INT, -1, 0, "bytes per chunk of ring all-reduce, reduce-scatter and all-gather over shared memory below STREAM_THRESHOLD (-1: the tuner's choice up to 4 ranks, the smallest L2 of the ranks / NSLOTS, a power of two within 32-128 KiB; whole slots from 5 ranks and where RING_DIRECT=1 or DIRECT_REDUCE=1 ask for single copy; 0: a whole slot)")
PARAM(SPIN, INT, 16, 0, "polls before a wait yields (50 ms), then sleeps 1 us..1 ms")
PARAM(YIELD_NS, INT, 50000000, 0, "nanoseconds a wait yields the CPU (sched_yield) after spinning, before it sleeps (a peer's shm publish wakes it, else at most 1 ms); a thread whose yields go to other work sleeps instead for a while: 1 s after one yield of 0.5 ms, 50 ms when oversubscribed by the job's ranks after a 20 ms window spent mostly in yields of 0.5 ms or more with more tasks runnable than ranks")
PARAM(SPIN_NS, INT, 50000, 0, "nanoseconds a wait keeps polling after its SPIN polls, before it yields or sleeps (0: none); not on oversubscribed hosts")
PARAM(PROGRESS_THREAD, INT, 1, 0, "1: a progress thread drives async ops while the caller computes")
PARAM(ASYNC_WAIT_SLEEP, INT, 1, 0, "1: a wait for async ops that the progress thread drives (chorusWait, chorusWaitAll) sleeps once its spin ends, woken when an op retires, instead of yielding and polling beside the thread (which took the core from the caller's other threads); 0: it polls like every other wait")
PARAM(ROOT_CHECK, INT, 1, 0, "1: rooted collectives check that every rank agrees about the root (and count, dtype): broadcast and reduce close their chain with a 40-byte header that the rank at its head waits for (a broadcast root waits for the first chunk to go round the ring), gather and scatter exchange header-only chunks with the root both ways, so ranks that disagree fail that op instead of returning success or waiting for CHORUS_TIMEOUT; small rooted ops cost up to a round trip more. 0: no check. The same on every rank")
/* communicator config overrides (NCCL's names) */
PARAM(COMM_BLOCKING, INT, -1, 1, "override ncclConfig_t.blocking (0 or 1)")

/* Valid ranges of the INT parameters (INT64_MAX: no upper bound but the type's). */
PARAM_RANGE(TIMEOUT, 1, 31536000) /* a year; the deadlines count nanoseconds in 64 bits */
PARAM_RANGE(SHM_DISABLE, 0, 1)
PARAM_RANGE(P2P_DISABLE, 0, 1)
PARAM_RANGE(CUDA_STAGE_COPY, -1, 1)
PARAM_RANGE(CUDA_IPC_DEVICE_SLOTS, 0, 1)
PARAM_RANGE(DEVICE_EMU, 0, 1)
PARAM_RANGE(DEVICE_CHANNELS, 0, 32)
PARAM_RANGE(DEVICE_SLOT_BYTES, 4096, 16777216)
PARAM_RANGE(DEVICE_VEC, 0, 1)
PARAM_RANGE(DEVICE_DIRECT, -2, 1099511627776)
PARAM_RANGE(DEVICE_LL_MAX, 0, 65536)
PARAM_RANGE(DEVICE_NET_DIRECT, 0, 1)
PARAM_RANGE(IB_DISABLE, 0, 1)
PARAM_RANGE(IB_GID_INDEX, -1, 255)
PARAM_RANGE(IB_TIMEOUT, 1, 31)
PARAM_RANGE(IB_RETRY_CNT, 0, 7)
PARAM_RANGE(IB_ROCE_VERSION_NUM, 1, 2)
PARAM_RANGE(IB_TC, 0, 255)
PARAM_RANGE(IB_SL, 0, 15)
PARAM_RANGE(IB_QPS_PER_CONNECTION, 1, 32)
PARAM_RANGE(IB_SPLIT_DATA_ON_QPS, 0, 1)
PARAM_RANGE(IB_ZCOPY_THRESHOLD, -1, 1073741824)
PARAM_RANGE(BUFFSIZE, 4096, 1073741824) /* and at least 64 bytes per slot (NSLOTS) */
PARAM_RANGE(NSLOTS, 1, 1024)
PARAM_RANGE(P2P_NSLOTS, -1, 1024)
PARAM_RANGE(SHM_MAX_BYTES, 0, INT64_MAX)
PARAM_RANGE(SHM_CMA, -1, 1)
PARAM_RANGE(SHM_SLOT_STREAM, -1, 1)
PARAM_RANGE(SHM_CMA_THRESHOLD, -1, INT64_MAX)
PARAM_RANGE(SHM_CMA_COOP, 0, 1)
PARAM_RANGE(SHM_CMA_BLOCK, 4096, 1073741824)
PARAM_RANGE(SOCKET_NTHREADS, 0, 16)
PARAM_RANGE(SOCKET_SHARE, -1, 1)
PARAM_RANGE(NSOCKS_PERTHREAD, 1, 64)
PARAM_RANGE(SOCKET_RECV_NTHREADS, -1, 16)
PARAM_RANGE(SOCKET_HELPERS, 1, 16) /* TCP_MAX_THREADS */
PARAM_RANGE(SOCKET_MIN_SPLIT, 1, 1073741824)
PARAM_RANGE(SOCKET_BUFFSIZE, 0, 1073741824)
PARAM_RANGE(SOCKET_DIRECT_THRESHOLD, 0, INT64_MAX)
PARAM_RANGE(SOCKET_RING_TUNE, -1, 15)
PARAM_RANGE(MIN_NCHANNELS, 1, 32) /* CHORUS_MAXCHANNELS */
PARAM_RANGE(MAX_NCHANNELS, 1, 32)
PARAM_RANGE(LL_THRESHOLD, -1, INT64_MAX)
PARAM_RANGE(ONESHOT_THRESHOLD, -1, INT64_MAX)
PARAM_RANGE(DIRECT_THRESHOLD, -1, INT64_MAX)
PARAM_RANGE(RING_DIRECT, -1, 1)
PARAM_RANGE(TREE_LAG, -1, 1048576)
PARAM_RANGE(DIRECT_REDUCE, 0, 1)
PARAM_RANGE(STREAM_THRESHOLD, -1, INT64_MAX)
PARAM_RANGE(STREAM_CHUNK, -1, 1073741824)
PARAM_RANGE(SHM_RING_CHUNK, -1, 1073741824)
PARAM_RANGE(SPIN, 0, 1000000000)
PARAM_RANGE(YIELD_NS, 0, 3600000000000) /* an hour */
PARAM_RANGE(SPIN_NS, 0, 3600000000000)
PARAM_RANGE(PROGRESS_THREAD, 0, 1)
PARAM_RANGE(ASYNC_WAIT_SLEEP, 0, 1)
PARAM_RANGE(ROOT_CHECK, 0, 1)
PARAM_RANGE(COMM_ID_INSECURE, 0, 1)
PARAM_RANGE(WARN_INTERVAL, 0, 31536000)
PARAM_RANGE(COMM_BLOCKING, -1, 1)

#ifdef CHORUS_PARAM_RANGE_EMPTY_
#undef PARAM_RANGE
#undef CHORUS_PARAM_RANGE_EMPTY_
#endif
