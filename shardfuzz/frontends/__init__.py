"""Stage ``frontends`` (layer 7 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

What users run: the CLI and its parser, campaigns, parallel jobs, the pytest plugin, the testing
helpers and the generated doc tables. The top layer.

- ``campaign.py``: campaigns: progress, distinct findings, summaries.
- ``display.py``: a campaign's progress: the live display on a terminal, plain lines elsewhere.
- ``cli.py``: the `shardfuzz` command: runs each subcommand.
- ``cli_args.py``: the command line's parser, argument types (durations, ...) and exit codes.
- ``doc_tables.py``: every generated section of the README, CONTRIBUTING and ``docs/`` (target
  tables from the records, options, environment variables, finding kinds, failure-file fields).
- ``fleet_view.py``: `shardfuzz findings`, `shardfuzz status`, and `replay redis://...` (the
  fleet's failure files through the file loader).
- ``given.py``: `run_case()`: one case from the user's own `@given` test, with runners kept warm
  per target, implementation and configuration (D44).
- ``jobs.py``: parallel `--jobs` children within a rank budget; Ctrl-C/SIGTERM forwarded,
  PR_SET_PDEATHSIG.
- ``pytest_compose.py``: how a `test_for` test composes with the user's set-up: a Hypothesis
  test whose settings are layered (shardfuzz profile, the active profile's changes, the
  `--shardfuzz-*` options, `@settings`, `test_for`'s arguments), the user's
  `@seed`/`@example`/`@reproduce_failure` handed to the `@given` inside, shardfuzz's statistics
  added to Hypothesis' (`--hypothesis-show-statistics`), and `regressions()`' filters (D44).
- ``pytest_options.py``: the values of the `--shardfuzz-*` pytest options, parsed and checked
  (usage errors).
- ``pytest_plugin.py``: pytest options, profiles, `test_for`, regressions.
- ``pytest_scope.py``: the test running now (`Scope`: the plugin's configuration for `run_case()`,
  the runners it used) and their statistics added to Hypothesis'; light, as the plugin enters it
  around every test.
- ``testing.py``: `assert_planted_bug_found` and `assert_reference_passes`, for user targets.
"""
