/* A thread that waits for another by reading the clock in a loop (what Node's main
 * thread does as it ends): it never blocks, so without the scheduler's turns in a run of
 * clock reads the worker it waits for would never get the baton. The worker sleeps, then
 * sets the flag; the main thread counts its reads until it sees it and prints the count,
 * which depends on timing natively and must repeat at replay. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

static volatile int flag;

static void *worker(void *arg) {
    (void)arg;
    struct timespec d = {0, 20 * 1000 * 1000};
    nanosleep(&d, NULL);
    __atomic_store_n(&flag, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

int main(void) {
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    long reads = 0;
    struct timespec ts;
    while (!__atomic_load_n(&flag, __ATOMIC_SEQ_CST)) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        reads++;
    }
    pthread_join(th, NULL);
    printf("reads %ld\n", reads);
    return 0;
}
