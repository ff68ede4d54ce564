# bash completion for sdctl. Installed as /usr/share/bash-completion/completions/sdctl,
# and printed by `sdctl completion bash` (embedded at build time from this very file;
# `sdctl completion zsh` prints it behind zsh's bashcompinit).
# Nothing is hard-coded here: the command names come from `sdctl __complete` (the
# generated command table) and each command's options and subcommands from the words of
# its own `sdctl COMMAND --help`, so new commands complete without touching this file.

_sdctl()
{
    # zsh (through bashcompinit): arrays indexed from 0, as bash's
    [[ -n ${ZSH_VERSION-} ]] && setopt localoptions ksharrays
    local cur prev words cword
    _init_completion 2>/dev/null || {
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    }

    local globals="--url --token --cluster -o --no-headers --watch --version --help"
    case $prev in
        -o) COMPREPLY=($(compgen -W "table wide json yaml name" -- "$cur")); return ;;
        --url|--token|--cluster) return ;;
    esac

    # Find the command: the first word after the global options and their values.
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
            --url|--token|--cluster|-o) ((i++)) ;;
            -*) ;;
            *) cmd=${words[i]}; break ;;
        esac
    done

    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "$globals" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$(sdctl __complete 2>/dev/null)" -- "$cur"))
        fi
        return
    fi

    # Options and subcommands of the command, read from its usage text: --flags, and
    # for the commands that have subcommands the lowercase words right after the name.
    local help
    help=$(sdctl "$cmd" --help 2>/dev/null)
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(grep -oE -- '--[a-z][a-z-]*' <<<"$help" | sort -u) --help" -- "$cur"))
    else
        # subcommands right after the name; then, for the commands that take an
        # INSTANCE, SERVICE or MACHINE, the names the cluster has (sdctl __complete names,
        # with the --url, --token and --cluster given on the line), and for those that take
        # an allocation ID the cluster's allocations (sdctl __complete allocations)
        local subs=""
        ((i + 1 == cword)) &&
            subs=$(grep -oE "sdctl $cmd [a-z][a-z-]+" <<<"$help" | awk '{print $3}' | sort -u)
        local names="" g=() j head3
        for ((j = 1; j < cword; j++)); do
            case ${words[j]} in
                --url|--token|--cluster) g+=("${words[j]}" "${words[j+1]}") ;;
            esac
        done
        head3=$(head -3 <<<"$help")
        grep -qE "INSTANCE|SERVICE|MACHINE|NAME" <<<"$head3" &&
            names=$(sdctl "${g[@]}" __complete names 2>/dev/null)
        grep -qE " ID$" <<<"$head3" && ((i + 1 < cword)) &&
            names+=" $(sdctl "${g[@]}" __complete allocations 2>/dev/null)"
        COMPREPLY=($(compgen -W "$subs $names" -- "$cur"))
    fi
}
complete -F _sdctl sdctl
