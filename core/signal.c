/* signal.c — a polite SIGINT: the first Ctrl-C sets a flag the experiment runner checks
 * between epochs (so the run file is closed cleanly, marked interrupted); the handler
 * then restores the default action, so a second Ctrl-C stops the process at once.
 * Lua cannot be called from a signal handler, and LuaJIT's own interrupt hook does not
 * fire inside compiled traces, hence a flag in C. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <signal.h>

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL);
}

void pn_interrupt_install(void) {
    interrupted = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

int pn_interrupted(void) { return interrupted; }
void pn_interrupt_clear(void) {
    interrupted = 0;
    signal(SIGINT, SIG_DFL);
}
