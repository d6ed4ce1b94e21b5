"""Berkeley Function Calling Leaderboard (BFCL) tasks as host environments.

Data: the JSONL files shipped inside the installed `bfcl-eval` wheel
(`bfcl_eval/data/BFCL_v4_*.json` and `data/possible_answer/`); nothing is
downloaded. `bfcl-eval` is a test/optional dependency (requirements-test.txt,
installed with --no-deps plus mpmath); this module imports it lazily.

Single-turn categories ('simple' = simple_python, 'multiple', 'parallel',
'parallel_multiple'): one assistant turn holding the call(s), in any format the
parser accepts (environments/host/parsers.py). It is scored by `check_calls`, our
re-implementation of BFCL's AST checker for Python (Patil et al., "The Berkeley
Function Calling Leaderboard", ICML 2025; bfcl_eval/eval_checker/ast_eval/
ast_checker.py): same verdict rules (function name; required parameters present;
no unexpected parameter; per-type value checks against the possible-answer lists,
with BFCL's string standardisation, int->float promotion, tuple->list, dict and
list-of-dict checks; omitted optional parameters must allow ""), plus a
fine-grained partial credit per field. experiments/bfcl_checker_agreement.py
measures agreement with BFCL's own checker.

Multi-turn base category ('multi_turn_base'): the episode spans every user
question; the policy's calls are executed against BFCL's executable API classes
(GorillaFileSystem, TwitterAPI, ...) by name with literal arguments (never
`eval`); a turn without a call ends the current user question and the next one
arrives as the observation. `correct` is BFCL's state check: after the episode,
every API instance's public attributes equal those after executing the gold calls.

Token format (byte tokenizer): prompt `BOS <task text>`; a call turn `<call>
f(a=1) </call>` (or `<tool_call>{json}</tool_call>` text); observations
`<obs> ... </obs>`.

Chat format (an `HFTokenizer`, e.g. an imported checkpoint's; `chat_format` is
an agentic_text.chat.ChatFormat): the prompt is the checkpoint's chat template
with a system message (`SYSTEM_PROMPT`: the tools as JSON schemas in
`<tools>` tags and the call format) and the user question, then the generation
prompt; the policy calls tools as `<tool_call>[{"name": ..., "arguments":
{...}}]</tool_call>` (Hermes JSON) or in Python-call syntax `[f(a=1)]`, both
parsed by environments/host/parsers.py; a turn ends at the checkpoint's stop
ids. Multi-turn: tool results come back as `tool` messages and the next user
question as a `user` message, each followed by the next generation prompt.

Modules (nothing is re-exported here: import the module that holds a name):

  data.py         the categories, `BFCLTask`, `load_category` (the wheel's
                  JSONL files and multi-turn function documents)
  checker.py      `check_calls`, our re-implementation of BFCL's AST checker
                  with partial credit; `gold_calls`
  prompts.py      the byte-format prompt, the chat format's system prompt
                  and tool schemas, text -> ids under a length limit
  execution.py    multi-turn API instances and bounded, isolated execution of
                  one call (`run_call`), the gold state
  single_turn.py  `BFCLEnv` (registry name 'bfcl')
  multi_turn.py   `BFCLMultiTurnEnv` (registry name 'bfcl_multi_turn')
"""
