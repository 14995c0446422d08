// jemalloc's built-in options for Sluice's executables (MALLOC_CONF still overrides them).
//
// One arena per CPU instead of jemalloc's default of four per CPU: a shuffle moves buffers
// between many threads (mappers, senders, gRPC and pool threads), and memory freed into one
// arena is only reused by the threads of that arena. With fewer arenas the process reuses
// what it freed instead of touching fresh pages (measured on `sluice bench`, KEY order:
// ~49,000 page faults and ~165 MiB peak RSS with the default, ~35,000 and ~140 MiB here;
// docs/benchmarks.md).
extern "C" {
// NOLINTNEXTLINE: the name and type jemalloc looks for.
const char* malloc_conf = "percpu_arena:percpu";
}
