/* One command on a blocking hiredis connection (command.c), for store.c and rcluster.c. */
#ifndef SD_COMMAND_H
#define SD_COMMAND_H

#include <hiredis/hiredis.h>
#include <stddef.h>

/* redisCommandArgv(c, argc, argv, argl), the same reply and the same failures (NULL,
 * c->err and errno set as hiredis sets them), without its allocations per argument and
 * per call: the command is formatted into one buffer (on the stack when it fits) and
 * written straight to the socket when nothing else is queued on c. */
redisReply *sd__command_argv(redisContext *c, int argc, const char **argv,
                             const size_t *argl);

/* The command in RESP, as redisFormatCommandArgv writes it: its length, and the bytes
 * written to buf (which has room for that length). */
size_t sd__command_len(int argc, const size_t *argl);
void sd__command_format(char *buf, int argc, const char **argv, const size_t *argl);

#endif
