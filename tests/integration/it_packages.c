/* The Debian packages (packaging/CMakeLists.txt): builds them with cpack from this build
 * tree into a temp dir, then checks what an operator would get without touching the real
 * system:
 *   - dpkg-deb --info / --contents: names, Depends, files at /usr/bin, /lib/systemd/system,
 *     /usr/share/doc, the header and both libraries;
 *   - every library a binary links directly (readelf NEEDED) comes from a Debian package
 *     named in Depends (looked up with dpkg -S);
 *   - dpkg-deb -x into scratch roots: the binaries run `--version`; a program built
 *     against the extracted bbagent.h links the extracted libbbagent (shared, with
 *     LD_LIBRARY_PATH, and static) and runs;
 *   - dpkg --root installs all five into a scratch root whose package database holds only
 *     the library packages they need (so Depends are really checked), runs serverdir's
 *     postinst there (it creates the serverdir user in the scratch root's /etc/passwd),
 *     and refuses serverdir when libmicrohttpd12 is missing. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define BUILD_DIR SD_BIN_DIR "/.."
#define NPKG 5

static const char *const pkgs[NPKG] = {"serverdir", "bigbrother", "sdctl", "libbbagent0",
                                       "libbbagent-dev"};
static char out_dir[400], version[64];
static char debs[NPKG][700];

/* The test's one temp dir (h_tmpdir makes a new one per call). */
static const char *tmp(void)
{
    static const char *dir;
    if (!dir)
        dir = h_tmpdir();
    return dir;
}

/* Runs argv (no shell) to completion within timeout_ms, stdout+stderr captured into *out
 * (malloc'd, NUL-terminated; may be NULL). env: extra NAME=VALUE or NULL. Returns the
 * exit code, or -1 if it did not finish in time (it is killed). */
static int run(const char *const *argv, const char *const *env, int timeout_ms, char **out)
{
    static int seq;
    char log[500];
    snprintf(log, sizeof log, "%s/run-%d.log", tmp(), ++seq);
    pid_t pid = h_spawn(argv, log, env);
    int st = h_wait_exit(pid, timeout_ms), code = -1;
    if (st != -1)
        code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    else
        h_stop(pid, 100);
    if (out) {
        FILE *f = fopen(log, "r");
        size_t cap = 1 << 20, n = 0;
        *out = calloc(1, cap + 1);
        if (f) {
            n = fread(*out, 1, cap, f);
            fclose(f);
        }
        (*out)[n] = '\0';
    }
    if (code != 0 && out)
        print_message("%s exited %d:\n%.2000s\n", argv[0], code, *out);
    return code;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The value of control field `field` in dpkg-deb --info output (static buffer). */
static const char *control_field(const char *info, const char *field)
{
    static char val[1024];
    char key[64];
    snprintf(key, sizeof key, "\n %s: ", field);
    const char *p = strstr(info, key);
    val[0] = '\0';
    if (p) {
        p += strlen(key);
        size_t n = strcspn(p, "\n");
        snprintf(val, sizeof val, "%.*s", (int)n, p);
    }
    return val;
}

/* 1 if the comma-separated Depends list names package pkg. */
static int depends_has(const char *depends, const char *pkg)
{
    size_t l = strlen(pkg);
    for (const char *p = depends; (p = strstr(p, pkg)); p += l)
        if ((p == depends || p[-1] == ' ' || p[-1] == ',') &&
            (p[l] == '\0' || p[l] == ' ' || p[l] == ',' || p[l] == ':'))
            return 1;
    return 0;
}

/* Builds the packages once; every test uses them. */
static int build_packages(void **state)
{
    snprintf(out_dir, sizeof out_dir, "%s/debs", tmp());
    char *out;
    const char *ver[] = {SD_BIN_DIR "/sdctl", "--version", NULL};
    assert_int_equal(run(ver, NULL, 10000, &out), 0);
    assert_int_equal(sscanf(out, "sdctl %63s", version), 1);
    free(out);
    const char *cpack[] = {"cpack", "-G", "DEB", "-B", out_dir, "--config",
                           BUILD_DIR "/CPackConfig.cmake", NULL};
    assert_int_equal(run(cpack, NULL, 45000, &out), 0);
    free(out);
    const char *arch[] = {"dpkg", "--print-architecture", NULL};
    assert_int_equal(run(arch, NULL, 5000, &out), 0);
    out[strcspn(out, "\n")] = '\0';
    for (int i = 0; i < NPKG; i++) {
        snprintf(debs[i], sizeof debs[i], "%s/%s_%s_%s.deb", out_dir, pkgs[i], version, out);
        if (!exists(debs[i]))
            print_message("missing %s\n", debs[i]);
        assert_true(exists(debs[i]));
    }
    free(out);
    return 0;
}

static void control_and_contents(void **state)
{
    static const char *const depends[NPKG][7] = {
        {"libc6", "libmicrohttpd12", "libjansson4", "libhiredis0.14", "libjwt0",
#ifdef H_JEMALLOC
         "libjemalloc2",
#endif
         NULL},
        {"libc6", "libjansson4", "libcurl4", NULL},
        {"libc6", "libjansson4", "libcurl4", NULL},
        {"libc6", NULL},
        {"libbbagent0", NULL}};
    static const char *const files[NPKG][7] = {
        {"./usr/bin/serverdir", "./lib/systemd/system/serverdir.service",
         "./usr/lib/sysusers.d/serverdir.conf", "./usr/share/doc/serverdir/examples/serverdir.json",
         "./usr/share/doc/serverdir/examples/tokens.example",
         "./usr/share/doc/serverdir/examples/haproxy.cfg", NULL},
        {"./usr/bin/bigbrother", "./usr/bin/bbctl", "./lib/systemd/system/bigbrother.service",
         "./usr/share/doc/bigbrother/examples/bigbrother.json", NULL},
        {"./usr/bin/sdctl", "./usr/share/bash-completion/completions/sdctl", NULL},
        {"./usr/lib/libbbagent.so.0", NULL},
        {"./usr/include/bbagent.h", "./usr/lib/libbbagent.a", "./usr/lib/libbbagent.so", NULL}};
    for (int i = 0; i < NPKG; i++) {
        char *info, *contents;
        const char *a[] = {"dpkg-deb", "--info", debs[i], NULL};
        assert_int_equal(run(a, NULL, 10000, &info), 0);
        assert_string_equal(control_field(info, "Package"), pkgs[i]);
        assert_string_equal(control_field(info, "Version"), version);
        char deps[1024];
        snprintf(deps, sizeof deps, "%s", control_field(info, "Depends"));
        for (int d = 0; depends[i][d]; d++) {
            if (!depends_has(deps, depends[i][d]))
                print_message("%s: Depends '%s' lacks %s\n", pkgs[i], deps, depends[i][d]);
            assert_true(depends_has(deps, depends[i][d]));
        }
        assert_true(control_field(info, "Description")[0] != '\0');
        const char *c[] = {"dpkg-deb", "--contents", debs[i], NULL};
        assert_int_equal(run(c, NULL, 10000, &contents), 0);
        for (int f = 0; files[i][f]; f++) {
            char file[300], link[300];
            snprintf(file, sizeof file, " %s\n", files[i][f]);
            snprintf(link, sizeof link, " %s -> ", files[i][f]);
            int has = strstr(contents, file) || strstr(contents, link);
            if (!has)
                print_message("%s lacks %s in:\n%s\n", pkgs[i], files[i][f], contents);
            assert_true(has);
        }
        /* nothing lands in /usr/local, /etc or the build tree */
        assert_null(strstr(contents, "./usr/local"));
        assert_null(strstr(contents, "./etc/"));
        assert_null(strstr(contents, BUILD_DIR));
        free(info);
        free(contents);
    }
}

/* Extracts package i into a fresh dir and returns it (static per package). */
static const char *extract(int i)
{
    static char roots[NPKG][500];
    if (!roots[i][0]) {
        snprintf(roots[i], sizeof roots[i], "%s/x-%s", tmp(), pkgs[i]);
        const char *x[] = {"dpkg-deb", "-x", debs[i], roots[i], NULL};
        assert_int_equal(run(x, NULL, 10000, NULL), 0);
    }
    return roots[i];
}

/* The Debian package that provides shared library soname, via dpkg -S (static buffer). */
static const char *package_of(const char *soname)
{
    static char pkg[128];
    char pattern[200], *out;
    snprintf(pattern, sizeof pattern, "*/%s", soname);
    const char *a[] = {"dpkg", "-S", pattern, NULL};
    pkg[0] = '\0';
    if (run(a, NULL, 10000, &out) == 0) {
        size_t n = strcspn(out, ":");
        snprintf(pkg, sizeof pkg, "%.*s", (int)n, out);
    }
    free(out);
    return pkg;
}

static void depends_match_needed_libraries(void **state)
{
    static const struct {
        int pkg;
        const char *path;
    } bins[] = {{0, "/usr/bin/serverdir"}, {1, "/usr/bin/bigbrother"}, {1, "/usr/bin/bbctl"},
                {2, "/usr/bin/sdctl"}, {3, "/usr/lib/libbbagent.so.0"}};
    for (size_t b = 0; b < sizeof bins / sizeof bins[0]; b++) {
        char path[700], *dyn, *info;
        snprintf(path, sizeof path, "%s%s", extract(bins[b].pkg), bins[b].path);
        const char *r[] = {"readelf", "-d", path, NULL};
        assert_int_equal(run(r, NULL, 10000, &dyn), 0);
        const char *a[] = {"dpkg-deb", "--info", debs[bins[b].pkg], NULL};
        assert_int_equal(run(a, NULL, 10000, &info), 0);
        char deps[1024];
        snprintf(deps, sizeof deps, "%s", control_field(info, "Depends"));
        int needed = 0;
        for (char *p = dyn; (p = strstr(p, "(NEEDED)")); p++) {
            char soname[128];
            char *lb = strchr(p, '['), *rb = lb ? strchr(lb, ']') : NULL;
            assert_non_null(rb);
            snprintf(soname, sizeof soname, "%.*s", (int)(rb - lb - 1), lb + 1);
            needed++;
            /* the sanitizer runtimes of a -DSD_SANITIZE test build are never shipped */
            if (!strncmp(soname, "libasan.", 8) || !strncmp(soname, "libubsan.", 9) ||
                !strncmp(soname, "ld-linux", 8))
                continue;
            const char *pkg = package_of(soname);
            print_message("%s needs %s from %s\n", bins[b].path, soname, pkg);
            assert_true(pkg[0] != '\0');
            if (!depends_has(deps, pkg))
                print_message("%s: Depends '%s' lacks %s (for %s)\n", bins[b].path, deps, pkg,
                              soname);
            assert_true(depends_has(deps, pkg));
        }
        assert_true(needed >= 1);
        free(dyn);
        free(info);
    }
}

static void extracted_binaries_run(void **state)
{
    static const struct {
        int pkg;
        const char *bin, *expect;
    } bins[] = {{0, "serverdir", "serverdir "}, {1, "bigbrother", "bigbrother "},
                {2, "sdctl", "sdctl "}};
    for (size_t b = 0; b < sizeof bins / sizeof bins[0]; b++) {
        char path[700], want[100], *out;
        snprintf(path, sizeof path, "%s/usr/bin/%s", extract(bins[b].pkg), bins[b].bin);
        snprintf(want, sizeof want, "%s%s", bins[b].expect, version);
        const char *a[] = {path, "--version", NULL};
        assert_int_equal(run(a, NULL, 10000, &out), 0);
        assert_non_null(strstr(out, want));
        free(out);
    }
    char bbctl[700], *out;
    snprintf(bbctl, sizeof bbctl, "%s/usr/bin/bbctl", extract(1));
    const char *h[] = {bbctl, "--help", NULL};
    assert_int_equal(run(h, NULL, 10000, &out), 0);
    assert_non_null(strstr(out, "usage"));
    free(out);

    /* libbbagent0 + libbbagent-dev: a game built against the extracted header and libs */
    const char *dev = extract(4), *rt = extract(3);
    char src[600], inc[600], libdir[600], dyn[600], sta[600], ldpath[700];
    snprintf(src, sizeof src, "%s",
             h_write_file(tmp(), "game.c",
                          "#include <bbagent.h>\n#include <stdio.h>\n"
                          "int main(void) {\n"
                          "    bbagent_t *a = bbagent_open(NULL);\n"
                          "    if (!a) return 2;\n"
                          "    int r = bbagent_ready(a) | bbagent_status(a, 1, 8, NULL);\n"
                          "    bbagent_close(a, NULL);\n"
                          "    printf(\"bbagent works %d\\n\", r);\n"
                          "    return r != 0;\n"
                          "}\n",
                          0644));
    snprintf(inc, sizeof inc, "-I%s/usr/include", dev);
    snprintf(libdir, sizeof libdir, "-L%s/usr/lib", dev);
    snprintf(dyn, sizeof dyn, "%s/game-dyn", tmp());
    snprintf(sta, sizeof sta, "%s/game-static", tmp());
    /* a sanitizer build of the tree instruments the packaged libraries too: the game must
     * then link the sanitizer runtimes (a release build needs nothing) */
#ifdef __SANITIZE_ADDRESS__
    const char *san = "-fsanitize=address,undefined";
#else
    const char *san = "-O2";
#endif
    const char *cc_dyn[] = {"cc", san, inc, src, libdir, "-lbbagent", "-o", dyn, NULL};
    assert_int_equal(run(cc_dyn, NULL, 30000, &out), 0);
    free(out);
    /* the -dev package's libbbagent.so is only a link to the runtime package's file */
    snprintf(ldpath, sizeof ldpath, "LD_LIBRARY_PATH=%s/usr/lib", rt);
    const char *env[] = {ldpath, "BB_SOCKET=", NULL};
    const char *r_dyn[] = {dyn, NULL};
    assert_int_equal(run(r_dyn, env, 10000, &out), 0);
    assert_non_null(strstr(out, "bbagent works 0"));
    free(out);
    char stalib[700];
    snprintf(stalib, sizeof stalib, "%s/usr/lib/libbbagent.a", dev);
    const char *cc_sta[] = {"cc", san, inc, src, stalib, "-o", sta, NULL};
    assert_int_equal(run(cc_sta, NULL, 30000, &out), 0);
    free(out);
    const char *r_sta[] = {sta, NULL};
    assert_int_equal(run(r_sta, NULL, 10000, &out), 0);
    assert_non_null(strstr(out, "bbagent works 0"));
    free(out);
}

/* Writes text to path, each "/usr/bin/" replaced by root + "/usr/bin/". */
static void write_rebased(const char *path, const char *text, const char *root)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (const char *p = text; *p;) {
        const char *hit = strstr(p, "/usr/bin/");
        size_t n = hit ? (size_t)(hit - p) : strlen(p);
        fwrite(p, 1, n, f);
        if (!hit)
            break;
        fprintf(f, "%s/usr/bin/", root);
        p = hit + 9;
    }
    fclose(f);
}

/* The packaged units: systemd-analyze verify finds nothing to say (no unknown key, no
 * bad value; ExecStart pointed at the extracted binary), and they hold the settings the
 * daemons rely on. */
static void unit_files_verify(void **state)
{
    static const struct {
        int pkg;
        const char *unit, *must[4];
    } units[] = {
        {0, "serverdir.service", {"Type=notify\n", "WatchdogSec=", "ExecStart=/usr/bin/serverdir ", NULL}},
        {1, "bigbrother.service", {"Type=notify\n", "WatchdogSec=", "KillMode=process\n",
                                   "ExecStart=/usr/bin/bigbrother "}},
    };
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        char path[700], copy[700];
        const char *root = extract(units[u].pkg);
        snprintf(path, sizeof path, "%s/lib/systemd/system/%s", root, units[u].unit);
        char *text;
        size_t len;
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        text = calloc(1, 65537);
        len = fread(text, 1, 65536, f);
        text[len] = '\0';
        fclose(f);
        for (int m = 0; m < 4 && units[u].must[m]; m++)
            assert_non_null(strstr(text, units[u].must[m]));
        snprintf(copy, sizeof copy, "%s/verify-%s", tmp(), units[u].unit);
        assert_true(mkdir(copy, 0755) == 0 || errno == EEXIST);
        snprintf(copy + strlen(copy), sizeof copy - strlen(copy), "/%s", units[u].unit);
        write_rebased(copy, text, root);
        free(text);
        char *out;
        const char *v[] = {"systemd-analyze", "verify", "--man=no", copy, NULL};
        int rc = run(v, NULL, 20000, &out);
        if (out[0])
            print_message("systemd-analyze verify %s:\n%s\n", units[u].unit, out);
        assert_int_equal(rc, 0);
        assert_string_equal(out, "");
        free(out);
    }
}

/* The packaged example config is accepted as shipped by the packaged serverdir (flags
 * move its addresses to loopback ports and Redis to the test's). */
static void example_config_is_accepted(void **state)
{
    h_redis_t redis;
    assert_int_equal(h_redis_start(&redis), 0);
    const char *root = extract(0);
    char bin[700], cfg[700], listen[64], udp[64], url[128], log[600];
    snprintf(bin, sizeof bin, "%s/usr/bin/serverdir", root);
    snprintf(cfg, sizeof cfg, "%s/usr/share/doc/serverdir/examples/serverdir.json", root);
    int port = h_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(udp, sizeof udp, "127.0.0.1:%d", h_free_port());
    snprintf(url, sizeof url, "http://%s/readyz", listen);
    snprintf(log, sizeof log, "%s/example-serverdir.log", tmp());
    const char *argv[] = {bin, "--config", cfg, "--listen", listen, "--redis", redis.url,
                          "--tokens", h_tokens_file(), "--master-udp", udp, NULL};
    pid_t pid = h_spawn(argv, log, NULL);
    assert_true(pid > 0);
    assert_true(h_wait_until(h_http_ok, url, 10000));
    int st = h_stop(pid, 5000);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    h_redis_stop(&redis);
}

/* Makes a scratch dpkg root whose database lists the given installed packages (their
 * stanzas copied from the real database; dpkg-query reads it without locking). */
static void scratch_root(const char *root, const char *const *installed)
{
    char path[700];
    static const char *const dirs[] = {"", "/etc", "/var", "/var/lib", "/var/lib/dpkg",
                                       "/var/lib/dpkg/info", "/var/lib/dpkg/updates",
                                       "/var/lib/dpkg/triggers"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, sizeof path, "%s%s", root, dirs[i]);
        assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
    }
    snprintf(path, sizeof path, "%s/var/lib/dpkg/status", root);
    FILE *st = fopen(path, "w");
    assert_non_null(st);
    for (int i = 0; installed[i]; i++) {
        char *out;
        const char *q[] = {"dpkg-query", "-s", installed[i], NULL};
        assert_int_equal(run(q, NULL, 10000, &out), 0);
        fprintf(st, "%s\n", out);
        free(out);
        /* an empty file list per package (named pkg:arch for Multi-Arch: same ones) keeps
         * dpkg from warning about it */
        const char *w[] = {"dpkg-query", "-W", "-f=${binary:Package}", installed[i], NULL};
        assert_int_equal(run(w, NULL, 10000, &out), 0);
        char list[700];
        snprintf(list, sizeof list, "%s/var/lib/dpkg/info/%s.list", root, out);
        free(out);
        FILE *l = fopen(list, "w");
        if (l)
            fclose(l);
    }
    fclose(st);
    snprintf(path, sizeof path, "%s/var/lib/dpkg/available", root);
    FILE *av = fopen(path, "w");
    assert_non_null(av);
    fclose(av);
}

static void dpkg_installs_into_scratch_root(void **state)
{
    static const char *const libs[] = {"libc6", "libmicrohttpd12", "libjansson4",
                                       "libhiredis0.14", "libcurl4", "libssl3", "libjwt0",
#ifdef H_JEMALLOC
                                       "libjemalloc2",
#endif
                                       NULL};
    char root[500], rootopt[520], *out;
    snprintf(root, sizeof root, "%s/root", tmp());
    snprintf(rootopt, sizeof rootopt, "--root=%s", root);
    scratch_root(root, libs);
    const char *inst[] = {"dpkg", rootopt, "--force-script-chrootless", "--force-not-root",
                          "--log=/dev/null", "-i", debs[0], debs[1], debs[2], debs[3], debs[4],
                          NULL};
    assert_int_equal(run(inst, NULL, 30000, &out), 0);
    free(out);
    for (int i = 0; i < NPKG; i++) {
        const char *s[] = {"dpkg", rootopt, "-s", pkgs[i], NULL};
        assert_int_equal(run(s, NULL, 10000, &out), 0);
        assert_non_null(strstr(out, "Status: install ok installed"));
        free(out);
    }
    static const char *const files[] = {"/usr/bin/serverdir", "/usr/bin/bigbrother",
                                        "/usr/bin/bbctl", "/usr/bin/sdctl",
                                        "/lib/systemd/system/serverdir.service",
                                        "/lib/systemd/system/bigbrother.service",
                                        "/usr/lib/libbbagent.so.0", "/usr/include/bbagent.h"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s%s", root, files[i]);
        if (!exists(p))
            print_message("not installed: %s\n", files[i]);
        assert_true(exists(p));
    }
    /* serverdir's postinst created its system user in the scratch root, not on the host */
    char passwd[600];
    snprintf(passwd, sizeof passwd, "%s/etc/passwd", root);
    FILE *f = fopen(passwd, "r");
    assert_non_null(f);
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f))
        found |= !strncmp(line, "serverdir:", 10);
    fclose(f);
    assert_true(found);
    char ver[700];
    snprintf(ver, sizeof ver, "%s/usr/bin/serverdir", root);
    const char *v[] = {ver, "--version", NULL};
    assert_int_equal(run(v, NULL, 10000, &out), 0);
    free(out);

    /* the same root without libmicrohttpd12: dpkg refuses to configure serverdir */
    static const char *const fewer[] = {"libc6", "libjansson4", "libhiredis0.14", NULL};
    snprintf(root, sizeof root, "%s/root-nomhd", tmp());
    snprintf(rootopt, sizeof rootopt, "--root=%s", root);
    scratch_root(root, fewer);
    const char *bad[] = {"dpkg", rootopt, "--force-script-chrootless", "--force-not-root",
                         "--log=/dev/null", "-i", debs[0], NULL};
    assert_int_not_equal(run(bad, NULL, 30000, &out), 0);
    assert_non_null(strstr(out, "dependency problems"));
    assert_non_null(strstr(out, "libmicrohttpd12"));
    free(out);
    const char *s[] = {"dpkg", rootopt, "-s", "serverdir", NULL};
    run(s, NULL, 10000, &out);
    assert_null(strstr(out, "Status: install ok installed"));
    free(out);
}

int main(void)
{
    h_init(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(control_and_contents),
        cmocka_unit_test(depends_match_needed_libraries),
        cmocka_unit_test(extracted_binaries_run),
        cmocka_unit_test(unit_files_verify),
        cmocka_unit_test(example_config_is_accepted),
        cmocka_unit_test(dpkg_installs_into_scratch_root),
    };
    return cmocka_run_group_tests(tests, build_packages, NULL);
}
