/* Reading Redis replies: the accessors every module uses on script and command replies
 * (store.h). They never fail: a missing or mistyped element reads as "" or 0, so a
 * handler checks the reply's shape once and then reads fields without more tests. */
#include <stdlib.h>
#include <string.h>

#include "store.h"

const char *sd_reply_str(const redisReply *r, size_t i)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements)
        return "";
    const redisReply *e = r->element[i];
    return e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS ? e->str : "";
}

int64_t sd_reply_num(const redisReply *r, size_t i)
{
    if (r && r->type == REDIS_REPLY_ARRAY && i < r->elements &&
        r->element[i]->type == REDIS_REPLY_INTEGER)
        return r->element[i]->integer;
    return strtoll(sd_reply_str(r, i), NULL, 10);
}

int sd_reply_has_status(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_STRING;
}

int sd_reply_status_is(const redisReply *r, const char *st)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           strcmp(sd_reply_str(r, 0), st) == 0;
}
