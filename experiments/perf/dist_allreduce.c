/* experiments/perf/dist_allreduce.c — the plain-C reference of experiments/perf/dist.lua: an
 * osu_allreduce-style loop (OSU micro-benchmarks) over MPI_Allreduce of f32 sums, compiled by
 * that script with mpicc and run with mpirun -np N.
 *
 *   dist_allreduce BYTES:ITERS[,BYTES:ITERS…]
 *
 * For each size: ITERS/10 + 1 untimed calls, a barrier, then ITERS timed calls, for two buffers
 * (send → receive, as osu does) and in place (MPI_IN_PLACE, as pn.dist.all_reduce calls it).
 * Buffers hold zeros (no denormals, no overflow over many sums). The time of a size is the
 * slowest rank's (MPI_MAX), per call. Rank 0 prints one line per size:
 *   size BYTES ITERS US_TWO_BUFFERS US_IN_PLACE */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double timed(float *send, float *recv, int n, int iters) {
    for (int i = 0; i < iters / 10 + 1; i++)
        MPI_Allreduce(send ? send : MPI_IN_PLACE, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(send ? send : MPI_IN_PLACE, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc != 2) {
        if (rank == 0) fprintf(stderr, "usage: %s BYTES:ITERS[,BYTES:ITERS…]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    for (char *tok = strtok(argv[1], ","); tok; tok = strtok(NULL, ",")) {
        long long bytes = 0;
        int iters = 0;
        if (sscanf(tok, "%lld:%d", &bytes, &iters) != 2 || bytes < 4 || bytes % 4 || iters < 1 ||
            bytes / 4 > 0x7fffffff) {
            if (rank == 0) fprintf(stderr, "dist_allreduce: bad size '%s' (BYTES:ITERS, BYTES a multiple of 4)\n", tok);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        int n = (int)(bytes / 4);
        float *a = calloc((size_t)n, sizeof *a), *b = calloc((size_t)n, sizeof *b);
        if (!a || !b) {
            fprintf(stderr, "dist_allreduce: out of memory for %lld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        double two = timed(a, b, n, iters), inplace = timed(NULL, b, n, iters);
        if (rank == 0) printf("size %lld %d %.3f %.3f\n", bytes, iters, two * 1e6, inplace * 1e6);
        fflush(stdout);
        free(a);
        free(b);
    }
    MPI_Finalize();
    return 0;
}
