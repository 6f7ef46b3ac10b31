/* signal.c — a polite stop: the first SIGINT (Ctrl-C), SIGTERM (kill, a scheduler's stop) or
 * SIGHUP (a closed terminal) sets a flag the experiment runner checks between steps, so the
 * run file is closed cleanly and marked interrupted, and prints that it did; the handler then
 * restores the default actions, so a second signal stops the process at once. Lua cannot be called from a signal
 * handler, and LuaJIT's own interrupt hook does not fire inside compiled traces, hence a flag
 * in C. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <signal.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted; /* the signal number, 0 when none */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};

/* The runner polls the flag between steps, and a step can be an epoch of minutes (NMT): say at
 * once that the signal was heard. write(2) is async-signal-safe; stdio is not. Every stop
 * signal goes back to its default action, so a second one of any kind stops the process. */
static void on_stop(int sig) {
    interrupted = sig;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) signal(stop_signals[i], SIG_DFL);
    static const char msg[] = "\npenumbra: stop requested: the run stops and saves after its current step or "
                              "epoch; a second signal stops it at once\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

void pn_interrupt_install(void) {
    interrupted = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) sigaction(stop_signals[i], &sa, NULL);
}

int pn_interrupted(void) { return interrupted; }
void pn_interrupt_clear(void) {
    interrupted = 0;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) signal(stop_signals[i], SIG_DFL);
}
