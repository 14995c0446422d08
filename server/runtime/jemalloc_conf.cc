// jemalloc's built-in options for Sluice's executables (MALLOC_CONF still overrides them).
//
// One arena per CPU instead of jemalloc's default of four per CPU: a shuffle moves buffers
// between many threads (mappers, senders, gRPC and pool threads), and memory freed into one
// arena is only reused by the threads of that arena. With fewer arenas the process reuses
// what it freed instead of touching fresh pages (measured on `sluice bench`, KEY order:
// ~49,000 page faults and ~165 MiB peak RSS with the default, ~35,000 and ~140 MiB here;
// docs/benchmarks.md).
//
// The server also gives freed pages back after 2 s instead of jemalloc's 10 s, so that its
// resident memory follows its memory budget more closely: with --memory_budget_mb 32 and 8
// mappers pushing ~1 MiB frames, its peak RSS was 116-145 MiB with 10 s and 93-116 MiB with
// 250 ms (5 interleaved runs each, before the 4 MiB stream windows, which brought it to ~45 MiB
// whatever the decay); 0 ms gave ~50-57 MiB but a third less throughput (every burst faults its
// pages in again). 250 ms, used until the TLS measurements, made a TLS server fault in again
// what it had just given back: with 2 s, TLS ran at 0.815 and 0.868 of plaintext (KEY order,
// 15 interleaved rounds each) where it had run at 0.721, at the same peak RSS.
// docs/benchmarks.md has the runs.
extern "C" {
// NOLINTNEXTLINE: the name and type jemalloc looks for.
#ifdef SLUICE_SERVER_MALLOC_CONF
const char* malloc_conf = "percpu_arena:percpu,dirty_decay_ms:2000";
#else
const char* malloc_conf = "percpu_arena:percpu";
#endif
}
