from polar.cli import main

main()
