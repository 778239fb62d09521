"""`chatml-tools`: ChatML that keeps every turn of a tool-calling conversation, in the Hermes / Qwen2.5
form many open models were trained on: the `tools` schemas listed as JSON in the system turn, each assistant
tool call as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and tool results in a user turn as
`<tool_response>...</tool_response>` (consecutive results share one turn).

`{% generation %}` marks every assistant turn, its tool calls and its `<|im_end|>`, so TRL's
`assistant_only_loss` trains on what the assistant writes and masks the tool results as it masks user turns.
OpenAI rows carry a call's `arguments` as a JSON string, transformers' convention is a dict: a string is
written as it is, a dict as JSON. A call is `{type: function, function: {name, arguments}}` or `{name,
arguments}`. Written with explicit whitespace control, so it renders the same with or without Jinja's
`trim_blocks` (transformers sets it).
"""

from __future__ import annotations

TOOLS_PREAMBLE = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
CALL_FORMAT = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call>'
)

CHATML_TOOLS = (
    # a message's text: a string, or the text parts of a list of content parts
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content if part is mapping and part.type == 'text' -%}{{ part.text }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # the system turn: the system message when it comes first, then the tools
    "{%- set has_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools or has_system -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if has_system -%}{{ text(messages[0].content) }}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if has_system -%}{{ '\\n\\n' }}{%- endif -%}"
    f"{{{{ '{TOOLS_PREAMBLE}' }}}}"
    "{%- for tool in tools -%}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}"
    f"{{{{ '{CALL_FORMAT}' }}}}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}"
    "{{ text(message.content) }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set function = call.function if call.function else call -%}"
    "{%- if not loop.first or text(message.content) -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<tool_call>\\n{\"name\": ' }}{{ function.name | tojson }}{{ ', \"arguments\": ' }}"
    "{%- if function.arguments is string -%}{{ function.arguments }}"
    "{%- else -%}{{ (function.arguments if function.arguments is defined else {}) | tojson }}{%- endif -%}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>' }}"
    "{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' }}{{ text(message.content) }}{{ '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' }}{{ text(message.content) }}{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
