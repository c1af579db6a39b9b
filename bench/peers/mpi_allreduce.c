/* Open MPI peer for bench/allreduce_busbw.py: MPI_Allreduce, float32, SUM.
 *
 * Same protocol as bench/allreduce_busbw.cc (the distrain side), so the two
 * figures are comparable:
 *   1. Every rank fills the buffer with value(i, r) = (7 i + 3 r) mod 11 and
 *      runs one all-reduce; every rank checks every element against the exact
 *      sum (small integers, exact in float32). A wrong result exits 1.
 *   2. Warm-up: `warmup` more all-reduces; rank 0 times them and picks the
 *      iteration count: enough for `target` seconds, at least `min_iters`, at
 *      most `max_iters`; MPI_Bcast shares it.
 *   3. Timed: each all-reduce is timed on its own on rank 0, no barrier in
 *      between (steady state, as in a training loop); the median is reported.
 * In place (MPI_IN_PLACE), like distrain's AllReduce, and MPI's cheapest
 * form. The values are not reset between iterations: positive values only
 * grow (to +inf at worst), which costs the same as any other value on x86
 * (no denormals).
 *
 *   mpi_allreduce [--sizes 4096,65536,...] [--warmup 5] [--min-iters 5]
 *                 [--max-iters 20000] [--target-seconds 0.5]
 * Rank 0 prints one line per size:
 *   RESULT {"side": "mpi", "ranks": N, "bytes": B, "iters": K, "median_s": T, "mean_s": T}
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64

static int CompareDoubles(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int ParseSizes(const char* text, long long* sizes) {
  int n = 0;
  char* copy = strdup(text);
  for (char* tok = strtok(copy, ","); tok != NULL && n < MAX_SIZES; tok = strtok(NULL, ",")) {
    sizes[n++] = atoll(tok);
  }
  free(copy);
  return n;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  long long sizes[MAX_SIZES];
  int num_sizes = ParseSizes("4096,65536,1048576,16777216,67108864", sizes);
  int warmup = 5, min_iters = 5, max_iters = 20000;
  double target = 0.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--sizes") == 0) {
      num_sizes = ParseSizes(argv[i + 1], sizes);
    } else if (strcmp(argv[i], "--warmup") == 0) {
      warmup = atoi(argv[i + 1]);
    } else if (strcmp(argv[i], "--min-iters") == 0) {
      min_iters = atoi(argv[i + 1]);
    } else if (strcmp(argv[i], "--max-iters") == 0) {
      max_iters = atoi(argv[i + 1]);
    } else if (strcmp(argv[i], "--target-seconds") == 0) {
      target = atof(argv[i + 1]);
    } else {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: unknown flag %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }

  for (int s = 0; s < num_sizes; ++s) {
    const long long bytes = sizes[s];
    const long long count = bytes / (long long)sizeof(float);
    if (count > INT32_MAX) {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: %lld bytes is over MPI's int count\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float* buf = (float*)malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
    if (buf == NULL) {
      fprintf(stderr, "mpi_allreduce: rank %d cannot allocate %lld bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }

    /* 1. Correctness. */
    for (long long i = 0; i < count; ++i) buf[i] = (float)((7 * i + 3 * rank) % 11);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long long bad = 0, first_bad = -1;
    for (long long i = 0; i < count; ++i) {
      long long want = 0;
      for (int r = 0; r < size; ++r) want += (7 * i + 3 * r) % 11;
      if (buf[i] != (float)want) {
        if (first_bad < 0) first_bad = i;
        ++bad;
      }
    }
    if (bad > 0) {
      fprintf(stderr, "mpi_allreduce: rank %d: %lld of %lld elements wrong (first at %lld: %g)\n",
              rank, bad, count, first_bad, buf[first_bad]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* 2. Warm-up, then rank 0 picks the iteration count. */
    double t0 = MPI_Wtime();
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double per_op = warmup > 0 ? (MPI_Wtime() - t0) / warmup : 0.0;
    int iters = min_iters;
    if (rank == 0 && per_op > 0) {
      double want = target / per_op;
      if (want > iters) iters = want > max_iters ? max_iters : (int)want + 1;
    }
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);

    /* 3. Timed. */
    double* times = (double*)malloc(sizeof(double) * (size_t)iters);
    double total = 0;
    for (int i = 0; i < iters; ++i) {
      double a = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times[i] = MPI_Wtime() - a;
      total += times[i];
    }
    if (rank == 0) {
      qsort(times, (size_t)iters, sizeof(double), CompareDoubles);
      double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
      printf("RESULT {\"side\": \"mpi\", \"ranks\": %d, \"bytes\": %lld, \"iters\": %d, "
             "\"median_s\": %.9g, \"mean_s\": %.9g}\n",
             size, bytes, iters, median, total / iters);
      fflush(stdout);
    }
    free(times);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
