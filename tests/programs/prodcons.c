/* Three producer threads and a consumer meeting on a mutex and a condition variable,
 * with sleeps between items: the order of the items is the interleaving. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int items[64], n;

static void *produce(void *arg) {
    long id = (long)arg;
    for (int i = 0; i < 16; i++) {
        usleep((useconds_t)(rand() % 300));
        pthread_mutex_lock(&m);
        items[n++] = (int)(id * 100 + i);
        pthread_cond_signal(&c);
        pthread_mutex_unlock(&m);
    }
    return NULL;
}

int main(void) {
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, produce, (void *)i);
    int got = 0;
    pthread_mutex_lock(&m);
    while (got < 48) {
        while (n == got) pthread_cond_wait(&c, &m);
        printf("%d ", items[got++]);
    }
    pthread_mutex_unlock(&m);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    printf("\n%ld\n", ts.tv_nsec);
    return 0;
}
