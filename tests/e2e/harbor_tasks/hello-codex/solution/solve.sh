#!/bin/bash
printf '%s' 'harbor-codex-ok' > hello.txt
