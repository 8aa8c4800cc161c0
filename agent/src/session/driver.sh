# The POSIX sh session driver of sandbox-agent. The agent starts `/bin/sh -c
# BOOTSTRAP`, which moves the control socket from fd 0 to fd 9 (fd 0 becomes
# /dev/null), reads this source line by line up to a line ".", and evals it; the
# bootstrap leaves a newline in $n. One line per control message:
#   agent -> driver  "eval N", then the N lines of the code
#   driver -> agent  "done STATUS" ($? of the code)
#   agent -> driver  "flush MARKER": the driver writes MARKER to its saved stdout
#                    (fd 8) and stderr (fd 7), ending the evaluation's output
#   agent -> driver  "reseed SEED" -> "ok" ($RANDOM, where the shell has one)
# The code runs in this shell (cd, variables and functions persist) with fds 7-9
# closed, so neither it nor what it starts can reach the control socket; the marker
# is sent only after it finished. A SIGINT (the agent's timeout) interrupts the
# foreground command; the trap keeps the shell itself alive, and records an
# interrupt that came before the code began, which then does not run.
__sbx_nl=$n
unset d l n
exec 8>&1 7>&2
__sbx_random=0
[ "${RANDOM:-x}" != "${RANDOM:-x}" ] && __sbx_random=1
__sbx_st=0
__sbx_busy=
__sbx_intr=
trap '__sbx_intr=1' INT
__sbx_ret() { return "$1"; }
__sbx_run() { __sbx_ret "$__sbx_st"; eval "$__sbx_code"; }
__sbx_finish() {
    __sbx_st=$1
    __sbx_busy=
    __sbx_code=
    printf 'done %d\n' "$__sbx_st" >&9
    IFS= read -r __sbx_m <&9 || exit 0
    __sbx_intr=
    __sbx_m=${__sbx_m#flush }
    printf %s "$__sbx_m" >&8
    printf %s "$__sbx_m" >&7
    __sbx_m=
}
__sbx_serve() {
    while :; do
        # Code that ran `continue` comes back here without finishing.
        [ -n "$__sbx_busy" ] && __sbx_finish 0
        IFS= read -r __sbx_op <&9 || exit 0
        case $__sbx_op in
        eval\ *)
            __sbx_n=${__sbx_op#eval }
            __sbx_code=
            while [ "$__sbx_n" -gt 0 ]; do
                IFS= read -r __sbx_l <&9 || exit 0
                __sbx_code=$__sbx_code$__sbx_l$__sbx_nl
                __sbx_n=$((__sbx_n - 1))
            done
            __sbx_l=
            __sbx_busy=1
            if [ -n "$__sbx_intr" ]; then
                __sbx_finish 130
            else
                __sbx_run 7>&- 8>&- 9<&-
                __sbx_finish $?
            fi
            ;;
        reseed\ *)
            [ "$__sbx_random" = 1 ] && RANDOM=${__sbx_op#reseed }
            printf 'ok\n' >&9
            ;;
        *) exit 70 ;;
        esac
    done
}
printf 'ready\n' >&9
# Code that ran `break` (busybox sh lets it leave the loop of a caller) ends up here.
while :; do
    __sbx_serve
    [ -n "$__sbx_busy" ] && __sbx_finish 0
done
