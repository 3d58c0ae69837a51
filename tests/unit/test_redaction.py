"""Tests for trainmeter_core.model.redaction: secrets hidden by name and by shape, everything else left readable.

Fake tokens are built by concatenation so that no secret scanner mistakes this file for a leak.
"""

import pytest

from trainmeter_core.model.redaction import REDACTED, is_secret_name, redact_argv, redact_env, redact_value

HF_TOKEN_SHAPE = "hf_" + "a1" * 17  # hf_ + 34 alphanumerics, the length Hugging Face issues
GITHUB_CLASSIC_SHAPE = "ghp_" + "A1b2" * 9  # ghp_ + 36
SLACK_WEBHOOK = "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
HEALTHCHECKS_PING = "https://hc-ping.com/eb095278-f28d-448d-87fb-7b75c171a6aa"
TELEGRAM_SEND = "https://api.telegram.org/bot123456:ABC-DEF1234ghIkl-zyx57W2v1u123ew11/sendMessage"


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        "--api-key",
        "--hf_token",
        "--wandb-key",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "HF_TOKEN",
        "--apiKey",  # case boundary: api, key
        "--HFToken",  # case boundary: hf, token
        "OPENAI_APIKEY",
        "API_KEY_2",  # a trailing index is not the last word
        "SENTRY_DSN",
        "--slack.webhook",
        "MYSQL_PWD",
        "--client-credentials",
        "-token",
    ],
)
def test_names_whose_last_word_says_secret_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "--max-tokens",
        "--key-dim",
        "--secret-file",
        "TOKENIZERS_PARALLELISM",
        "--num-keys",
        "--tokenizer",
        "--auth-method",
        "PATH",
        "--lr",
        "--",
        "",
    ],
)
def test_names_that_only_mention_a_secret_word_stay_readable(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["PGPASSWORD", "AWS_ACCESS_KEY_ID", "--aws-access-key-id", "NGROK_AUTHTOKEN"]
)
def test_well_known_secret_names_are_secret_although_their_last_word_is_not(name):
    assert is_secret_name(name)


def test_a_plugin_declared_name_is_secret_with_or_without_its_dashes():
    extra = ["--webhook-url", "TM_WEBHOOK_URL"]
    assert not is_secret_name("--webhook-url")
    assert is_secret_name("--webhook-url", extra)
    assert is_secret_name("webhook-url", extra)
    assert is_secret_name("TM_WEBHOOK_URL", extra)
    assert is_secret_name("--TM_WEBHOOK_URL", extra)


def test_a_plugin_declared_name_matches_exactly_not_by_case_or_prefix():
    extra = ["TM_WEBHOOK_URL"]
    assert not is_secret_name("tm_webhook_url", extra)
    assert not is_secret_name("TM_WEBHOOK_URLS", extra)


def test_extra_names_given_as_one_string_is_refused_with_the_string_named():
    with pytest.raises(TypeError, match="'--webhook-url'"):
        is_secret_name("--webhook-url", "--webhook-url")


# ---------------------------------------------------------------- values


def test_a_slack_webhook_url_keeps_only_its_host_and_first_segment():
    assert redact_value(SLACK_WEBHOOK) == "https://hooks.slack.com/services/***/***/***"


def test_a_healthchecks_ping_url_hides_its_uuid():
    assert redact_value(HEALTHCHECKS_PING) == "https://hc-ping.com/***"


def test_a_healthchecks_ping_url_keeps_its_signal_readable():
    assert redact_value(HEALTHCHECKS_PING + "/start") == "https://hc-ping.com/***/start"


def test_a_healthchecks_ping_key_url_hides_the_key_even_without_digits_and_keeps_the_slug():
    # A 22-character ping key of letters only is not token-like by its shape: the host rule hides it.
    url = "https://hc-ping.com/pingKeyOnlyLetters_ab/nightly"
    assert redact_value(url) == "https://hc-ping.com/***/nightly"


def test_a_telegram_bot_url_hides_the_bot_token_and_keeps_the_method():
    assert redact_value(TELEGRAM_SEND) == "https://api.telegram.org/***/sendMessage"


def test_a_short_telegram_bot_token_is_hidden_too():
    # "bot12:abc" is 9 characters, below the 16 of the generic rule: the bot shape alone catches it.
    assert redact_value("https://api.telegram.org/bot12:abc/getMe") == "https://api.telegram.org/***/getMe"


def test_an_ntfy_url_hides_the_auth_query_value_and_keeps_the_topic():
    assert redact_value("https://ntfy.sh/topic?auth=abc") == "https://ntfy.sh/topic?auth=***"


def test_every_query_value_is_hidden_and_every_key_kept():
    assert redact_value("https://x.io/p?a=1&sig=zz&empty=&flag") == "https://x.io/p?a=***&sig=***&empty=&flag"


def test_user_info_in_a_git_url_is_hidden():
    url = "https://oauth2:" + GITHUB_CLASSIC_SHAPE + "@github.com/org/repo.git"
    assert redact_value(url) == "https://***@github.com/org/repo.git"


def test_a_user_name_alone_is_user_info_too():
    assert redact_value("ssh://git@github.com/org/repo.git") == "ssh://***@github.com/org/repo.git"


def test_a_url_inside_a_longer_string_is_redacted_in_place():
    assert redact_value("--url=https://u:p@db.local:5432/x?k=v") == "--url=https://***@db.local:5432/x?k=***"


def test_two_urls_glued_by_a_comma_are_each_redacted():
    # Read as one URL, the second's user info would sit in the first's path and escape.
    text = "https://a.io/x,https://u:p@b.io/"
    assert redact_value(text) == "https://a.io/x,https://***@b.io/"


def test_a_fragment_with_an_access_token_is_hidden_and_a_route_fragment_kept():
    assert (
        redact_value("https://app.io/cb#access_token=abc&t=1") == "https://app.io/cb#access_token=***&t=***"
    )
    assert redact_value("https://app.io/#/runs/12") == "https://app.io/#/runs/12"


def test_a_uuid_path_segment_is_hidden_anywhere_in_a_web_url():
    assert (
        redact_value("https://x.io/hooks/eb095278-f28d-448d-87fb-7b75c171a6aa/go")
        == "https://x.io/hooks/***/go"
    )


def test_a_long_mixed_segment_is_hidden_and_a_long_word_or_number_is_not():
    # 16+ of [A-Za-z0-9_-:.~] with a letter and a digit is token-like; letters only or digits only is not.
    url = "https://x.io/abcdefgh12345678/abcdefghijklmnopq/1234567890123456/abc123"
    assert redact_value(url) == "https://x.io/***/abcdefghijklmnopq/1234567890123456/abc123"


def test_a_plain_local_path_is_left_alone():
    assert redact_value("/data/run_2024_11_01_abcdef/ckpt.pt") == "/data/run_2024_11_01_abcdef/ckpt.pt"


def test_storage_urls_keep_their_run_folders_readable():
    assert (
        redact_value("s3://bucket/run_2024_11_01_abcdef/ckpt.pt")
        == "s3://bucket/run_2024_11_01_abcdef/ckpt.pt"
    )
    assert redact_value("file:///data/run_2024_11_01_abcdef/x") == "file:///data/run_2024_11_01_abcdef/x"


def test_storage_urls_still_hide_user_info_and_query_values():
    assert redact_value("s3://key:sec@bucket/a?versionId=7") == "s3://***@bucket/a?versionId=***"


@pytest.mark.parametrize(
    "token",
    [
        HF_TOKEN_SHAPE,
        GITHUB_CLASSIC_SHAPE,
        "gho_" + "Z9" * 18,
        "github_pat_" + "11ABCDEFG0" * 8,
        "sk-" + "proj-" + "x1" * 12,
        "xoxb-" + "123456789012-" + "abcdefABCDEF123",
        "AKIAIOSFODNN7EXAMPLE",  # AWS's own documentation example
    ],
)
def test_well_known_token_shapes_are_hidden_anywhere_in_text(token):
    assert redact_value(f"login with {token} please") == "login with *** please"


def test_a_word_that_ends_in_sk_dash_is_not_an_api_key():
    text = "task-" + "abcdefghijklmnopqrstuvwxyz"
    assert redact_value(text) == text


def test_a_short_hf_prefix_is_not_a_token():
    assert redact_value("hf_transfer") == "hf_transfer"


def test_redacting_twice_changes_nothing_more():
    text = f"{SLACK_WEBHOOK} {HEALTHCHECKS_PING} {TELEGRAM_SEND} https://u:p@h.io/?a=1 {HF_TOKEN_SHAPE}"
    once = redact_value(text)
    assert redact_value(once) == once
    # 3 Slack segments + 1 ping uuid + 1 bot token + 1 user info + 1 query value + 1 hf token = 8
    assert once.count(REDACTED) == 8


def test_a_long_string_without_urls_is_scanned_quickly_and_unchanged():
    # A bounded scheme keeps the scan linear; an unbounded one takes minutes on 200 kB of letters.
    text = "a" * 200_000
    assert redact_value(text) == text


# ---------------------------------------------------------------- argv


def test_secret_option_values_are_hidden_and_their_names_kept():
    argv = ["tm", "train.py", "--api-key", "x", "--hf_token=y", "--wandb-key", "z"]
    assert redact_argv(argv) == ["tm", "train.py", "--api-key", "***", "--hf_token=***", "--wandb-key", "***"]


def test_ordinary_options_stay_readable():
    argv = ["train.py", "--max-tokens", "512", "--key-dim", "64", "--secret-file", "s.txt", "--lr=3e-4"]
    assert redact_argv(argv) == argv


def test_a_secret_option_followed_by_another_option_has_no_value_to_hide():
    argv = ["train.py", "--api-key", "--verbose", "--max-tokens=512"]
    assert redact_argv(argv) == argv


def test_a_secret_option_at_the_end_has_no_value_to_hide():
    assert redact_argv(["train.py", "--password"]) == ["train.py", "--password"]


def test_a_secret_value_that_looks_like_a_negative_number_is_still_hidden():
    assert redact_argv(["--key", "-5"]) == ["--key", "***"]


def test_an_empty_secret_value_stays_empty():
    assert redact_argv(["--hf_token=", "--api-key", ""]) == ["--hf_token=", "--api-key", ""]


def test_an_option_declared_by_a_plugin_is_hidden():
    argv = ["train.py", "--webhook-url", "https://example.com/hook", "--notify-url=https://example.com/n"]
    redacted = redact_argv(argv, extra_names=["--webhook-url", "notify-url"])
    assert redacted == ["train.py", "--webhook-url", "***", "--notify-url=***"]


def test_hydra_overrides_and_env_assignments_with_secret_names_are_hidden():
    argv = ["env", "HF_TOKEN=abc", "python", "train.py", "logger.wandb.api_key=k", "trainer.max_epochs=3"]
    assert redact_argv(argv) == [
        "env",
        "HF_TOKEN=***",
        "python",
        "train.py",
        "logger.wandb.api_key=***",
        "trainer.max_epochs=3",
    ]


def test_every_other_element_goes_through_value_redaction():
    argv = ["train.py", "--notify", SLACK_WEBHOOK, "--url=https://u:p@h.io/x", HF_TOKEN_SHAPE]
    assert redact_argv(argv) == [
        "train.py",
        "--notify",
        "https://hooks.slack.com/services/***/***/***",
        "--url=https://***@h.io/x",
        "***",
    ]


def test_argv_keeps_its_length_and_order():
    argv = ["tm", "--api-key", "--api-key", "a", "--token", "b", "c", "--x=1", "--password"]
    redacted = redact_argv(argv)
    assert len(redacted) == len(argv)
    assert redacted == ["tm", "--api-key", "--api-key", "***", "--token", "***", "c", "--x=1", "--password"]


def test_the_input_argv_is_not_modified():
    argv = ["--api-key", "x"]
    redact_argv(argv)
    assert argv == ["--api-key", "x"]


# ---------------------------------------------------------------- env


def test_secret_variables_are_hidden_and_others_stay_readable():
    env = {"WANDB_API_KEY": "w", "GITHUB_TOKEN": "g", "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin"}
    assert redact_env(env) == {
        "WANDB_API_KEY": "***",
        "GITHUB_TOKEN": "***",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": "/usr/bin",
    }


def test_a_slack_url_under_an_ordinary_name_is_hidden_by_its_shape():
    assert redact_env({"SLACK_URL": SLACK_WEBHOOK}) == {
        "SLACK_URL": "https://hooks.slack.com/services/***/***/***"
    }


def test_a_proxy_with_user_info_is_hidden_by_its_shape():
    env = {"HTTPS_PROXY": "http://me:pw@proxy.local:3128"}
    assert redact_env(env) == {"HTTPS_PROXY": "http://***@proxy.local:3128"}


def test_a_variable_declared_by_a_plugin_is_hidden():
    env = {"TM_WEBHOOK_URL": "https://example.com/hook", "TM_RUN_NAME": "a"}
    assert redact_env(env, extra_names=["--webhook-url", "TM_WEBHOOK_URL"]) == {
        "TM_WEBHOOK_URL": "***",
        "TM_RUN_NAME": "a",
    }


def test_an_empty_secret_variable_stays_empty_so_a_failed_login_is_explained():
    assert redact_env({"HF_TOKEN": ""}) == {"HF_TOKEN": ""}


def test_env_keeps_its_names_and_their_order():
    env = {"Z": "1", "HF_TOKEN": "t", "A": "2"}
    assert list(redact_env(env)) == ["Z", "HF_TOKEN", "A"]
