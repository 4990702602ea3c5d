#!/bin/bash
echo "deploying version ${1:-latest}"
