// A host prelude that runs the CUDA C of kernels/cuda/ with CUDA's execution semantics
// (tests/kernels/cuda_emu): g++ -std=c++20 -include emu.h compiles the program text NVRTC
// gets (kernels.cuda_kernels.program) plus a registry the Python side generates, and
// emu_launch runs a kernel on a grid. It exists to test the kernels' own thread logic
// (indexing, grid shapes, __syncthreads trees, warp shuffles, the launchers' arguments)
// before any GPU run; it is not a GPU and proves nothing about one.
//
// How a launch runs: every CUDA thread of a block is a fiber (its own stack; emu_switch
// below swaps stacks), all of a block's fibers on one OS thread. A fiber runs until it
// reaches a barrier (__syncthreads, or a warp shuffle: all 32 lanes write their value,
// then each reads its partner's), then the next runnable fiber of the block runs, in
// thread order; a barrier makes its waiters runnable when the last one arrives. Fibers,
// not OS threads: a block has up to 256 threads meeting at thousands of barriers (each
// step of a shuffle tree is one): OS threads on two cores would spend far more time
// switching (microseconds each) than computing. A grid's blocks are shared out among a few OS threads, each running its
// blocks one at a time to the end, so `__shared__` is `static thread_local`: one copy per
// OS thread, which the fibers of the block that thread runs share, as a block's threads
// share its shared memory.
//
// Checked as errors (emu_launch returns nonzero, emu_error says why): a barrier that can
// never complete (threads of a block waiting at different barriers: __syncthreads in a
// divergent branch), a thread returning while others wait for it at a barrier,
// __syncthreads after some thread of the block returned (undefined in CUDA), a shuffle
// whose mask names a lane that has returned or is not in the block, the lanes of a warp
// shuffling at different source lines, a block of over 1024 threads.
//
// NOT emulated: the memory model (a write is seen at once by every fiber; nothing is
// reordered or cached), real concurrency inside a block (fibers switch only at barriers,
// in thread order: a missing __syncthreads usually shows, as a wrong value, because
// thread 0 runs ahead of all others; a race that this one order happens to win passes),
// timing, occupancy and resource limits (shared memory size, registers; threads per block
// are checked against 1024), shared memory left uninitialised (here it holds the previous
// block's values, or zeros), reads out of bounds (a wild access crashes the process; the
// Python side catches writes just past an array), CUDA's expf / tanhf (glibc's run here:
// within a few ulp), sub-warp masks, and whatever NVRTC accepts and g++ does not.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#error "the emulator's fiber switch is written for x86-64"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
// Each shuffle site is named by its line, so lanes meeting at different sites are an error.
#define __shfl_xor_sync(mask, value, lane_mask) \
    emu::shfl_xor((mask), (value), (lane_mask), __LINE__)

// CUDA's float4, and the mat-vec's 16-byte load with the alignment the device requires
// checked (an unaligned float4 load faults on a GPU; on x86 it would just work).
struct alignas(16) float4 {
    float x, y, z, w;
};
namespace emu {
inline float4 float4_at(const float* p);
}
#define PN_FLOAT4_AT(p) emu::float4_at(p)

struct emu_dim3 {
    unsigned x = 1, y = 1, z = 1;
};
// The running fiber's indices: set by the scheduler of this OS thread at every switch.
inline thread_local emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// The fiber switch: callee-saved registers on the old stack, then the new stack's.
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl emu_switch
.hidden emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

namespace emu {

constexpr size_t STACK = 256 * 1024;  // per fiber; a guard page below it faults on overflow
constexpr int MAX_THREADS = 1024;

enum State { RUNNABLE, AT_SYNC, AT_SHFL, DONE };

struct Fiber {
    void* stack = nullptr;  // mmap'd, the lowest page PROT_NONE
    void* sp = nullptr;
    State state = DONE;
    int shfl_line = 0;
    emu_dim3 index;  // its threadIdx
};

struct Warp {
    int lanes = 0;     // threads of the block in this warp (32 unless the block is not)
    int waiting = 0;   // lanes at the current shuffle
    int done = 0;      // lanes that returned
    int parity = 0;    // the slot buffer the current shuffle writes
    float slots[2][32];
};

// One OS thread's scheduler: runs blocks one at a time, each thread of a block a fiber.
struct Runner {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    void* main_sp = nullptr;
    int current = 0, threads = 0, at_sync = 0, done = 0;
    void (*body)(void*) = nullptr;
    void* ctx = nullptr;
    std::string error;

    ~Runner() {
        for (Fiber& f : fibers)
            if (f.stack) munmap(f.stack, STACK);
    }
    void fail(const std::string& why) {
        if (error.empty()) error = why;
    }
};

inline thread_local Runner* runner = nullptr;

inline void set_thread_index(const Runner& r, int t) { threadIdx = r.fibers[t].index; }

// The current fiber stops here (its state says why): on to the next runnable fiber, round
// robin, switched to directly; back to run_block when none is (the block is done, or
// deadlocked) or on an error.
inline void yield() {
    Runner& r = *runner;
    int from = r.current;
    if (r.error.empty()) {
        for (int i = 1; i <= r.threads; ++i) {
            int t = from + i < r.threads ? from + i : from + i - r.threads;
            if (r.fibers[t].state != RUNNABLE) continue;
            if (t == from) return;  // the last to arrive at a barrier, alone in the block
            r.current = t;
            set_thread_index(r, t);
            emu_switch(&r.fibers[from].sp, r.fibers[t].sp);
            return;
        }
    }
    emu_switch(&r.fibers[from].sp, r.main_sp);
}

[[noreturn]] inline void fiber_entry() {
    Runner& r = *runner;
    r.body(r.ctx);
    Fiber& f = r.fibers[r.current];
    f.state = DONE;
    r.done++;
    Warp& w = r.warps[r.current / 32];
    w.done++;
    if (w.waiting) r.fail("a lane returned while others of its warp wait at a shuffle");
    if (r.at_sync) r.fail("a thread returned while others of the block wait at __syncthreads");
    yield();
    __builtin_unreachable();
}

inline void start_fiber(Fiber& f, int t) {
    if (!f.stack) {
        f.stack = mmap(nullptr, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        mprotect(f.stack, 4096, PROT_NONE);
    }
    // emu_switch pops six registers and returns into fiber_entry, which sees the stack as
    // a call left it (rsp + 8 a multiple of 16).
    // The stacks' tops staggered by 17 cache lines: at one alignment, the fibers' frames
    // would all fall in the same cache sets (3x slower).
    void** top = (void**)((char*)f.stack + STACK - (t % 64) * 17 * 64);
    *--top = nullptr;  // fiber_entry's return address: it never returns
    *--top = (void*)&fiber_entry;
    for (int i = 0; i < 6; ++i) *--top = nullptr;
    f.sp = top;
    f.state = RUNNABLE;
}

// Runs one block to its end (or to an error); false on error.
inline bool run_block(Runner& r) {
    r.done = r.at_sync = 0;
    for (int t = 0; t < r.threads; ++t) {
        start_fiber(r.fibers[t], t);
        r.fibers[t].index = {t % blockDim.x, t / blockDim.x % blockDim.y,
                             t / (blockDim.x * blockDim.y)};
    }
    for (size_t i = 0; i < r.warps.size(); ++i) {
        Warp& w = r.warps[i];
        w.lanes = min(32, r.threads - (int)i * 32);
        w.waiting = w.done = w.parity = 0;
    }
    r.current = 0;
    set_thread_index(r, 0);
    emu_switch(&r.main_sp, r.fibers[0].sp);  // back when no fiber can run
    if (r.error.empty() && r.done < r.threads) {
        r.fail("deadlock: threads of the block wait at different barriers (" +
               std::to_string(r.at_sync) + " at __syncthreads, the others at shuffles): " +
               "a barrier in a divergent branch");
    }
    return r.error.empty();
}

inline float4 float4_at(const float* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16) runner->fail("a float4 load from an address not 16-byte aligned");
    float4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

inline void syncthreads() {
    Runner& r = *runner;
    if (r.done) r.fail("__syncthreads after some threads of the block returned");
    r.fibers[r.current].state = AT_SYNC;
    if (++r.at_sync == r.threads) {  // the last to arrive releases everyone
        for (int t = 0; t < r.threads; ++t) r.fibers[t].state = RUNNABLE;
        r.at_sync = 0;
    }
    yield();
}

template <class T>
T shfl_xor(unsigned mask, T value, int lane_mask, int line) {
    static_assert(sizeof(T) == 4, "the emulated shuffle moves 32-bit values");
    Runner& r = *runner;
    int lane = r.current % 32;
    Warp& w = r.warps[r.current / 32];
    unsigned members = w.lanes == 32 ? 0xffffffffu : (1u << w.lanes) - 1;
    if (mask != 0xffffffffu) r.fail("only full-warp shuffles (mask 0xffffffff) are emulated");
    if (mask & ~members) r.fail("a shuffle's mask names lanes the block does not have");
    if (w.done) r.fail("a full-warp shuffle after a lane of the warp returned");
    float* slots = w.slots[w.parity];
    memcpy(&slots[lane], &value, 4);
    Fiber& f = r.fibers[r.current];
    f.state = AT_SHFL;
    f.shfl_line = line;
    if (++w.waiting == w.lanes) {
        int base = r.current / 32 * 32;
        for (int l = 0; l < w.lanes; ++l) {
            Fiber& g = r.fibers[base + l];
            if (g.shfl_line != line)
                r.fail("lanes of a warp shuffle at different lines (" + std::to_string(line) +
                       ", " + std::to_string(g.shfl_line) + ")");
            g.state = RUNNABLE;
        }
        w.waiting = 0;
        w.parity ^= 1;  // the next shuffle writes the other buffer: this one is still read
    }
    yield();
    T out;
    memcpy(&out, &slots[(lane ^ lane_mask) & 31], 4);
    return out;
}

// ---- launching ----

inline std::mutex error_mutex;
inline std::string last_error;

template <class T>
T read_arg(void* p) {
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

// Runs every block of the grid: OS threads take blocks in turn, each runs its blocks one at
// a time. Returns 0, or 1 with last_error set.
inline int run_grid(emu_dim3 grid, emu_dim3 block, void (*body)(void*), void* ctx) {
    long long threads = (long long)block.x * block.y * block.z;
    long long blocks = (long long)grid.x * grid.y * grid.z;
    {
        std::lock_guard<std::mutex> lock(error_mutex);
        last_error.clear();
        if (threads < 1 || threads > MAX_THREADS) last_error = "threads per block not in 1..1024";
        if (grid.y > 65535 || grid.z > 65535) last_error = "grid y or z over 65535";
        if (!last_error.empty()) return 1;
    }
    static std::vector<Runner> pool(std::max(1u, std::min(4u, std::thread::hardware_concurrency())));
    std::atomic<long long> next{0};
    auto work = [&](Runner& r) {
        runner = &r;
        blockDim = block;
        gridDim = grid;
        r.threads = (int)threads;
        r.body = body;
        r.ctx = ctx;
        r.error.clear();
        if (r.fibers.size() < (size_t)threads) r.fibers.resize(threads);
        r.warps.resize((threads + 31) / 32);
        for (long long i; (i = next++) < blocks;) {
            blockIdx.x = i % grid.x;
            blockIdx.y = i / grid.x % grid.y;
            blockIdx.z = i / ((long long)grid.x * grid.y);
            if (!run_block(r)) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (last_error.empty())
                    last_error = r.error + " (block " + std::to_string(blockIdx.x) + "," +
                                 std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) +
                                 ", thread " + std::to_string(r.current) + ")";
                next = blocks;
            }
        }
        runner = nullptr;
    };
    std::vector<std::thread> workers;
    size_t n = (size_t)std::min<long long>(pool.size(), blocks);
    for (size_t i = 1; i < n; ++i) workers.emplace_back(work, std::ref(pool[i]));
    if (n) work(pool[0]);
    for (auto& w : workers) w.join();
    return last_error.empty() ? 0 : 1;
}

template <class... P, size_t... I>
int launch_impl(void (*kernel)(P...), emu_dim3 grid, emu_dim3 block, void** args,
                std::index_sequence<I...>) {
    std::tuple<P...> values{read_arg<P>(args[I])...};
    struct Ctx {
        void (*kernel)(P...);
        std::tuple<P...>* values;
    } ctx{kernel, &values};
    auto body = [](void* c) {
        Ctx& x = *(Ctx*)c;
        std::apply(x.kernel, *x.values);
    };
    return run_grid(grid, block, body, &ctx);
}

template <class... P>
int launch(void (*kernel)(P...), emu_dim3 grid, emu_dim3 block, void** args) {
    return launch_impl(kernel, grid, block, args, std::index_sequence_for<P...>{});
}

// A parameter as the Python side checks arguments against it: "i4", "f4", "i8", ... for a
// scalar; "p" and the pointee's ("pf4", "pi4", "pu1") for a pointer.
template <class T>
std::string kind() {
    if constexpr (std::is_pointer_v<T>) {
        return "p" + kind<std::remove_cv_t<std::remove_pointer_t<T>>>();
    } else {
        char k = std::is_floating_point_v<T> ? 'f' : std::is_signed_v<T> ? 'i' : 'u';
        return k + std::to_string(sizeof(T));
    }
}

template <class... P>
std::string signature(void (*)(P...)) {
    std::string s;
    ((s += kind<P>() + ","), ...);
    return s;
}

// The registry the Python side appends: one Entry per kernel of the program.
struct Entry {
    const char* name;
    int (*launch)(emu_dim3, emu_dim3, void**);
    std::string (*signature)();
};

template <auto K>
Entry entry(const char* name) {
    return {name, [](emu_dim3 g, emu_dim3 b, void** a) { return launch(K, g, b, a); },
            [] { return signature(K); }};
}

inline std::mutex launch_mutex;  // one launch at a time: the runners' pool is shared

}  // namespace emu

#define __syncthreads() emu::syncthreads()

// emu_launch(name, grid, block, args): 0, or nonzero with emu_error() saying why;
// emu_signature(name): the parameters' kinds ("pu1,pf4,i4,..."), or "" for no such kernel.
#define EMU_EXPORTS(table)                                                                  \
    static const emu::Entry* emu_find(const char* name) {                                   \
        for (const emu::Entry& e : table)                                                   \
            if (!strcmp(e.name, name)) return &e;                                           \
        return nullptr;                                                                     \
    }                                                                                       \
    extern "C" int emu_launch(const char* name, int gx, int gy, int gz, int bx, int by,     \
                              int bz, void** args) {                                        \
        std::lock_guard<std::mutex> lock(emu::launch_mutex);                                \
        const emu::Entry* e = emu_find(name);                                               \
        if (!e) {                                                                           \
            emu::last_error = std::string("no kernel ") + name;                             \
            return 2;                                                                       \
        }                                                                                   \
        emu_dim3 grid{(unsigned)gx, (unsigned)gy, (unsigned)gz};                            \
        return e->launch(grid, {(unsigned)bx, (unsigned)by, (unsigned)bz}, args);           \
    }                                                                                       \
    extern "C" const char* emu_signature(const char* name) {                                \
        static std::string s;                                                               \
        const emu::Entry* e = emu_find(name);                                               \
        s = e ? e->signature() : "";                                                        \
        return s.c_str();                                                                   \
    }                                                                                       \
    extern "C" const char* emu_error() { return emu::last_error.c_str(); }
