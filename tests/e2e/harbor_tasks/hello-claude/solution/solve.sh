#!/bin/bash
printf '%s' 'harbor-claude-ok' > hello.txt
